"""Completion webhooks on a real PostgreSQL and a real receiver: the trigger, the statements and
the delivery loop's ``run_once`` at its edges (due, backoff, give-up, in-flight lease, two loops)."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.domain.types import DeliveryOutcome, LeaseUpdate, NewJob
from app.domain.webhooks import ADDRESS_REFUSED, AddressPolicy, parse_networks
from app.maintenance.webhooks import WebhookConfig, WebhookCounts, WebhookDeliveries
from app.queue.services import Services
from app.store.statements import statement
from jobq_client import verify_signature
from tests.integration.helpers import db_now, service
from tests.webhook_receiver import Received, receiver

SECRET = "whsec_test_secret_for_integration"
LOOPBACK = AddressPolicy(parse_networks("127.0.0.1/32"))


def loop_of(svc: Services, **overrides: Any) -> WebhookDeliveries:
    """The delivery loop with a loopback receiver allowed and the test secret."""
    options: dict[str, Any] = {
        "timeout_seconds": 2.0,
        "in_flight_seconds": 30.0,
        "backoff_base_seconds": 10.0,
        "backoff_cap_seconds": 100.0,
        "give_up_seconds": 3600.0,
        "default_secret": SECRET,
        "policy": LOOPBACK,
        **overrides,
    }
    return WebhookDeliveries(services=svc, config=WebhookConfig(**options))


async def finished_job(
    svc: Services, url: str | None, *, outcome: str = "complete", queue: str = "hooks"
) -> int:
    """Enqueues a job with this callback and finishes it: complete, fail (dead) or cancel."""
    [(job, _)] = await svc.jobs.enqueue(
        [NewJob(queue=queue, type="t", payload={"n": 1}, max_attempts=1, callback_url=url)]
    )
    if outcome == "cancel":
        await svc.ops.cancel(job.id)
        return job.id
    [held] = await svc.jobs.claim(worker_id="w", queues=[queue], max_jobs=1, lease_seconds=30)
    item = LeaseUpdate(job_id=held.id, lease_id=str(held.lease_id), result={"ok": True})
    if outcome == "complete":
        await svc.jobs.complete(worker_id="w", items=[item])
    else:
        item.error = "boom"
        await svc.jobs.fail(worker_id="w", items=[item])
    return job.id


async def deliveries(engine: AsyncEngine) -> list[dict[str, Any]]:
    async with engine.connect() as conn:
        rows = await conn.execute(text("SELECT * FROM webhook_deliveries ORDER BY created_at, id"))
        return [dict(r) for r in rows.mappings()]


async def webhook_events(engine: AsyncEngine, job_id: int) -> list[dict[str, Any]]:
    async with engine.connect() as conn:
        rows = await conn.execute(
            text("SELECT * FROM job_events WHERE job_id = :id AND kind = 'webhook' ORDER BY id"),
            {"id": job_id},
        )
        return [dict(r) for r in rows.mappings()]


def status_plan(*statuses: int) -> Any:
    """An answer giving these statuses to a delivery's attempts in order (then 200)."""

    async def answer(request: Received, seen_before: int) -> int:
        return statuses[seen_before] if seen_before < len(statuses) else 200

    return answer


async def test_only_finishes_of_jobs_with_a_callback_write_a_delivery(
    svc: Services, clean_db: AsyncEngine
) -> None:
    url = "http://127.0.0.1:9/hook"
    done = await finished_job(svc, url)
    dead = await finished_job(svc, url, outcome="fail")
    cancelled = await finished_job(svc, url, outcome="cancel")
    await finished_job(svc, None)
    await finished_job(svc, None, outcome="fail")
    rows = await deliveries(clean_db)
    assert [(r["job_id"], r["body"]["status"]) for r in rows] == [
        (done, "succeeded"),
        (dead, "dead"),
        (cancelled, "cancelled"),
    ]
    first = rows[0]
    assert first["state"] == "pending" and first["attempts"] == 0 and first["url"] == url
    assert first["body"]["delivery_id"] == str(first["id"])
    assert first["body"]["result"] == {"ok": True} and first["body"]["attempts"] == 1
    assert rows[1]["body"]["last_error"] == "boom"


async def test_run_once_delivers_signed_and_records_the_attempt_in_the_history(
    svc: Services, clean_db: AsyncEngine
) -> None:
    async with receiver() as hook:
        job_id = await finished_job(svc, hook.url())
        counts = await loop_of(svc).run_once()
        assert counts == WebhookCounts(taken=1, delivered=1)
        assert await loop_of(svc).run_once() == WebhookCounts()  # nothing due any more
    [got] = hook.received
    stamp = verify_signature(got.body, got.headers["jobq-signature"], SECRET)
    [row] = await deliveries(clean_db)
    assert abs(stamp - row["updated_at"].timestamp()) < 5
    assert got.delivery_id == str(row["id"]) == got.json["delivery_id"]
    assert got.headers["jobq-delivery-attempt"] == "1"
    assert got.headers["content-type"] == "application/json"
    assert got.json["job_id"] == job_id and got.json["status"] == "succeeded"
    assert row["state"] == "delivered" and row["last_status"] == 200 and row["delivered_at"]
    [event] = await webhook_events(clean_db, job_id)
    assert event["data"]["outcome"] == "delivered" and event["data"]["status_code"] == 200
    assert event["data"]["delivery_id"] == str(row["id"])


async def test_a_failed_attempt_backs_off_and_is_due_exactly_at_its_next_attempt(
    svc: Services, clean_db: AsyncEngine
) -> None:
    async with receiver(status_plan(500, 503)) as hook:
        job_id = await finished_job(svc, hook.url())
        before = await db_now(clean_db)
        assert (await loop_of(svc).run_once()).retrying == 1
        [row] = await deliveries(clean_db)
        # Half the base (10 s) plus a random part of the other half, from the attempt.
        assert before + timedelta(seconds=5) <= row["next_attempt_at"]
        assert row["next_attempt_at"] <= await db_now(clean_db) + timedelta(seconds=10)
        assert row["last_status"] == 500 and row["state"] == "pending"
        due = row["next_attempt_at"]
        assert await loop_of(svc).run_once(now=due - timedelta(microseconds=1)) == WebhookCounts()
        assert (await loop_of(svc).run_once(now=due)).retrying == 1
        [row] = await deliveries(clean_db)
        # The second backoff's ceiling doubled: within [10 s, 20 s] of the attempt.
        assert due + timedelta(seconds=10) <= row["next_attempt_at"] <= due + timedelta(seconds=20)
        assert (await loop_of(svc).run_once(now=row["next_attempt_at"])).delivered == 1
    assert [r.status for r in hook.received] == [500, 503, 200]
    assert len({r.delivery_id for r in hook.received}) == 1
    events = await webhook_events(clean_db, job_id)
    assert [e["data"]["outcome"] for e in events] == ["retrying", "retrying", "delivered"]
    assert events[0]["data"]["error"] == "answered HTTP 500"
    assert events[0]["data"]["next_attempt_at"]


async def test_the_attempt_at_the_give_up_time_fails_the_delivery(
    svc: Services, clean_db: AsyncEngine
) -> None:
    async with receiver(status_plan(500, 500, 500)) as hook:
        await finished_job(svc, hook.url())
        [row] = await deliveries(clean_db)
        give_up = row["created_at"] + timedelta(seconds=3600)
        # An attempt before the give-up time retries, at the latest at the give-up time.
        almost = give_up - timedelta(seconds=1)
        async with clean_db.begin() as conn:
            await conn.execute(
                text("UPDATE webhook_deliveries SET next_attempt_at = :t"), {"t": almost}
            )
        assert (await loop_of(svc).run_once(now=almost)).retrying == 1
        [row] = await deliveries(clean_db)
        assert row["next_attempt_at"] == give_up
        assert (await loop_of(svc).run_once(now=give_up)).failed == 1
        [row] = await deliveries(clean_db)
        assert row["state"] == "failed" and row["last_status"] == 500
        assert await loop_of(svc).run_once(now=give_up + timedelta(days=1)) == WebhookCounts()
    assert len(hook.received) == 2


async def test_a_crashed_senders_delivery_is_taken_again_after_its_in_flight_time(
    svc: Services, clean_db: AsyncEngine
) -> None:
    async with receiver() as hook:
        await finished_job(svc, hook.url())
        now = await db_now(clean_db)
        # A sender leases the delivery and dies before recording anything.
        [crashed] = await svc.webhooks.take(
            batch_size=10, in_flight_seconds=30, grace_seconds=0, now=now
        )
        assert crashed.attempts == 1
        leased_until = now + timedelta(seconds=30)
        still_leased = leased_until - timedelta(microseconds=1)
        assert await loop_of(svc).run_once(now=still_leased) == WebhookCounts()
        assert (await loop_of(svc).run_once(now=leased_until)).delivered == 1
        # The crashed sender coming back records nothing: its attempt's lease is gone.
        late = await svc.webhooks.record(
            crashed,
            outcome=DeliveryOutcome.RETRY,
            status=500,
            error="late",
            policy=loop_of(svc).config.retry,
        )
        assert late is None
    [row] = await deliveries(clean_db)
    assert row["state"] == "delivered" and row["attempts"] == 2
    assert [r.headers["jobq-delivery-attempt"] for r in hook.received] == ["2"]


async def test_two_loops_at_once_never_send_one_delivery_twice(
    svc: Services, clean_db: AsyncEngine, driver_pool: Any
) -> None:
    async def slow(request: Received, seen_before: int) -> int:
        await asyncio.sleep(0.02)
        return 200

    other = service(clean_db, driver_pool)
    async with receiver(slow) as hook:
        jobs = [await finished_job(svc, hook.url()) for _ in range(30)]
        loops = [loop_of(svc, batch_size=4), loop_of(other, batch_size=4)]
        for _ in range(20):
            counts = await asyncio.gather(*(loop.run_once() for loop in loops))
            if not any(c.taken for c in counts):
                break
    ids = [r.delivery_id for r in hook.received]
    assert len(ids) == len(set(ids)) == len(jobs)
    rows = await deliveries(clean_db)
    assert {r["state"] for r in rows} == {"delivered"} and {r["attempts"] for r in rows} == {1}


async def test_a_refused_address_fails_at_once_without_a_request(
    svc: Services, clean_db: AsyncEngine
) -> None:
    async with receiver() as hook:
        job_id = await finished_job(svc, hook.url())  # stored as is: the API would refuse it
        counts = await loop_of(svc, policy=AddressPolicy()).run_once()
    assert counts == WebhookCounts(taken=1, failed=1)
    assert hook.received == []
    [row] = await deliveries(clean_db)
    assert row["state"] == "failed" and row["last_status"] is None
    # What producers read names no address (the server's log does: tests/api).
    assert row["last_error"] == ADDRESS_REFUSED
    [event] = await webhook_events(clean_db, job_id)
    assert event["data"]["outcome"] == "failed" and event["data"]["error"] == ADDRESS_REFUSED


async def test_without_a_secret_the_attempt_is_retried_not_sent_unsigned(
    svc: Services, clean_db: AsyncEngine
) -> None:
    async with receiver() as hook:
        await finished_job(svc, hook.url())
        counts = await loop_of(svc, default_secret=None).run_once()
    assert counts.retrying == 1 and hook.received == []
    [row] = await deliveries(clean_db)
    assert row["last_error"].startswith("no signing secret")


async def test_a_keys_secret_signs_and_after_a_rotation_the_previous_one_too(
    svc: Services, clean_db: AsyncEngine
) -> None:
    async with clean_db.begin() as conn:
        key_id = (
            await conn.execute(
                text(
                    "INSERT INTO api_keys (name, role, secret_sha256) "
                    "VALUES ('p', 'producer', '\\x01') RETURNING id"
                )
            )
        ).scalar_one()
    before = await svc.webhooks.secret(key_id=key_id, grace_seconds=60)
    assert before.secret.startswith("whsec_") and len(before.secret) == 70
    rotated = await svc.webhooks.rotate_secret(
        key_id=key_id, grace_seconds=60, actor="ops", actor_key_id=None
    )
    assert rotated.previous_secret == before.secret and rotated.secret != before.secret
    async with receiver() as hook:
        [(job, _)] = await svc.jobs.enqueue(
            [NewJob(queue="k", type="t", callback_url=hook.url(), callback_key_id=key_id)]
        )
        await svc.ops.cancel(job.id)
        await loop_of(svc, default_secret=None, secret_grace_seconds=60).run_once()
        await finished_job(svc, hook.url())  # no key: the default secret
        await loop_of(svc, secret_grace_seconds=0).run_once()
    keyed, unkeyed = hook.received
    header = keyed.headers["jobq-signature"]
    assert header.count("v1=") == 2
    verify_signature(keyed.body, header, rotated.secret)
    verify_signature(keyed.body, header, before.secret)
    verify_signature(unkeyed.body, unkeyed.headers["jobq-signature"], SECRET)
    with pytest.raises(ValueError, match="no signature matches"):
        verify_signature(unkeyed.body, unkeyed.headers["jobq-signature"], rotated.secret)


async def test_finished_deliveries_are_pruned_after_their_retention(
    svc: Services, clean_db: AsyncEngine
) -> None:
    async with receiver() as hook:
        await finished_job(svc, hook.url())
        await loop_of(svc).run_once()
    await finished_job(svc, "http://127.0.0.1:9/pending")  # pending: never pruned
    [done, _] = await deliveries(clean_db)
    edge: datetime = done["updated_at"] + timedelta(seconds=100)
    assert await svc.webhooks.prune(batch_size=10, keep_seconds=100, now=edge) == 0
    later = edge + timedelta(microseconds=1)
    assert await svc.webhooks.prune(batch_size=10, keep_seconds=100, now=later) == 1
    assert [r["state"] for r in await deliveries(clean_db)] == ["pending"]


async def test_a_job_the_reaper_ends_is_delivered_too(svc: Services, clean_db: AsyncEngine) -> None:
    [(job, _)] = await svc.jobs.enqueue(
        [NewJob(queue="r", type="t", max_attempts=1, callback_url="http://127.0.0.1:9/")]
    )
    await svc.jobs.claim(worker_id="w", queues=["r"], max_jobs=1, lease_seconds=1)
    [reaped] = await svc.upkeep.reap(
        batch_size=10, now=await db_now(clean_db) + timedelta(seconds=5)
    )
    assert reaped.status == "dead"
    [row] = await deliveries(clean_db)
    assert (row["job_id"], row["body"]["status"]) == (job.id, "dead")


async def test_the_due_scan_reads_only_pending_deliveries_however_many_are_done(
    svc: Services, clean_db: AsyncEngine
) -> None:
    async with clean_db.begin() as conn:
        await conn.execute(
            text(
                "INSERT INTO webhook_deliveries (job_id, url, body, state, updated_at) "
                "SELECT g, 'http://x/', '{}', 'delivered', now() FROM generate_series(1, 20000) g"
            )
        )
        await conn.execute(
            text("INSERT INTO webhook_deliveries (job_id, url, body) VALUES (1, 'http://x/', '{}')")
        )
        await conn.execute(text("ANALYZE webhook_deliveries"))
        sql = statement("webhook_delivery_take").sql
        plan = (
            await conn.execute(
                text("EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF) " + sql),
                {"batch_size": 50, "in_flight_seconds": 60, "grace_seconds": 0, "now": None},
            )
        ).scalars()
        shown = "\n".join(plan)
        await conn.rollback()
    assert "ix_webhook_deliveries_due" in shown, shown
    assert "Seq Scan on webhook_deliveries" not in shown, shown
