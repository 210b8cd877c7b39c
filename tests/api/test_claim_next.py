"""``claim_next``: a complete, fail or release that claims the worker's next jobs in the same call.

The transition answers as it does alone; then the claim runs for the same worker and key, in the
same transaction when it can answer at once, else as a long-poll once the transition committed.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from datetime import datetime, timedelta
from typing import Any

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.api.state import app_state
from tests.api.helpers import claim, enqueue, get_job, lease, running_app
from tests.api.test_metrics import events, scrape
from tests.keys import Keys, as_key
from tests.polling import poll_until

Json = dict[str, Any]


async def settle(
    client: httpx.AsyncClient,
    op: str,
    worker: str,
    *leases: Json,
    claim_next: Json | None = None,
    status: int = 200,
) -> Json:
    body: Json = {"worker_id": worker, "leases": list(leases)}
    if claim_next is not None:
        body["claim_next"] = claim_next
    r = await client.post(f"/v1/{op}", json=body)
    assert r.status_code == status, r.text
    answer: Json = r.json()
    return answer


async def job_times(engine: AsyncEngine, job_id: int) -> Json:
    async with engine.connect() as conn:
        row = (
            await conn.execute(
                text("SELECT started_at, finished_at FROM jobs WHERE id = :id"), {"id": job_id}
            )
        ).one()
    return dict(row._mapping)


async def test_complete_with_claim_next_leases_the_next_job_to_the_same_worker_in_one_transaction(
    client: httpx.AsyncClient, clean_db: AsyncEngine
) -> None:
    first = await enqueue(client, queue="q")
    second = await enqueue(client, queue="q", payload={"n": 2})
    [held] = await claim(client, "w1", ["q"])
    assert held["id"] == first["id"]

    answer = await settle(
        client, "complete", "w1", lease(held, result={"ok": 1}), claim_next={"queues": ["q"]}
    )
    [result] = answer["results"]
    assert result["ok"] is True and result["status"] == "succeeded"
    assert "claim_error" not in answer
    [got] = answer["claimed"]["jobs"]
    assert got["id"] == second["id"] and got["payload"] == {"n": 2}
    assert got["worker_id"] == "w1" and got["attempt"] == 1 and got["lease_id"]
    assert got["status"] == "running" and got["lease_expires_at"]

    # The job objects are the ones POST /v1/claim answers: the same fields.
    await enqueue(client, queue="q")
    [plain] = await claim(client, "w2", ["q"])
    assert set(got) == set(plain)

    # The lease is the worker's: its heartbeat holds.
    beat = await settle(client, "heartbeat", "w1", lease(got))
    assert beat["results"][0]["ok"] is True and "claimed" not in beat
    assert (await get_job(client, first["id"]))["result"] == {"ok": 1}
    # One transaction: PostgreSQL's now() is the transaction's start, shared by both rows.
    done, taken = await job_times(clean_db, first["id"]), await job_times(clean_db, second["id"])
    assert done["finished_at"] == taken["started_at"]


async def test_without_claim_next_the_answer_is_as_before(
    client: httpx.AsyncClient, clean_db: AsyncEngine
) -> None:
    await enqueue(client, queue="q")
    await enqueue(client, queue="q")
    [held] = await claim(client, "w1", ["q"])
    for claim_next in (None, {"claim_next": None}):
        body: Json = {"worker_id": "w1", "leases": [lease(held)], **(claim_next or {})}
        r = await client.post("/v1/complete", json=body)
        assert r.status_code == 200
        assert list(r.json()) == ["results"]
    # Nothing was claimed: the other job is still pending.
    assert len(await claim(client, "w2", ["q"], max_jobs=5)) == 1


async def test_fail_and_release_with_claim_next(
    client: httpx.AsyncClient, clean_db: AsyncEngine
) -> None:
    a = await enqueue(client, queue="q", priority=2)
    b = await enqueue(client, queue="q", priority=1)
    c = await enqueue(client, queue="q", priority=0)
    [held] = await claim(client, "w1", ["q"])
    assert held["id"] == a["id"]

    failed = await settle(
        client,
        "fail",
        "w1",
        lease(held, error="boom", retryable=False),
        claim_next={"queues": ["q"], "lease_seconds": 120},
    )
    assert failed["results"][0]["status"] == "dead"
    [next_b] = failed["claimed"]["jobs"]
    assert next_b["id"] == b["id"] and next_b["worker_id"] == "w1"
    leased = datetime.fromisoformat(next_b["lease_expires_at"]) - datetime.fromisoformat(
        next_b["started_at"]
    )
    assert leased == timedelta(seconds=120)
    assert (await get_job(client, a["id"]))["last_error"] == "boom"

    # A release gives the job back first: with max_jobs 2 the same call takes it and c.
    released = await settle(
        client,
        "release",
        "w1",
        lease(next_b, checkpoint={"row": 7}),
        claim_next={"queues": ["q"], "max_jobs": 2},
    )
    assert released["results"][0]["status"] == "pending"
    jobs = {j["id"]: j for j in released["claimed"]["jobs"]}
    assert set(jobs) == {b["id"], c["id"]}
    assert jobs[b["id"]]["checkpoint"] == {"row": 7}
    assert jobs[b["id"]]["lease_id"] != next_b["lease_id"]

    # Nothing left: an empty list, answered at once (no wait asked).
    done = await settle(
        client, "complete", "w1", *(lease(j) for j in jobs.values()), claim_next={"queues": ["q"]}
    )
    assert [r["status"] for r in done["results"]] == ["succeeded", "succeeded"]
    assert done["claimed"] == {"jobs": []}


@pytest.mark.parametrize(
    ("claim_next", "field"),
    [
        ({"queues": ["q"], "max_jobs": 0}, "body.claim_next.max_jobs"),
        ({"queues": ["q"], "max_jobs": 101}, "body.claim_next.max_jobs"),
        ({"queues": ["q"], "wait_seconds": 21}, "body.claim_next.wait_seconds"),
        ({"queues": ["q"], "lease_seconds": 0}, "body.claim_next.lease_seconds"),
        ({"queues": []}, "body.claim_next.queues"),
        ({"queues": ["bad name"]}, "body.claim_next.queues[0]"),
        ({}, "body.claim_next.queues"),
        ({"queues": ["q"], "worker_id": "w2"}, "body.claim_next.worker_id"),
        ({"queues": ["q"], "max_jobs": "1"}, "body.claim_next.max_jobs"),
        (["q"], "body.claim_next"),
    ],
)
@pytest.mark.parametrize("op", ["complete", "fail", "release"])
async def test_an_invalid_claim_next_is_a_422_naming_the_field_and_changes_nothing(
    client: httpx.AsyncClient, clean_db: AsyncEngine, op: str, claim_next: Any, field: str
) -> None:
    await enqueue(client, queue="q")
    await enqueue(client, queue="q")
    [held] = await claim(client, "w1", ["q"])
    problem = await settle(client, op, "w1", lease(held), claim_next=claim_next, status=422)
    assert problem["status"] == 422
    assert field in [e["field"] for e in problem["errors"]], problem
    job = await get_job(client, held["id"])
    assert job["status"] == "running" and job["lease_id"] == held["lease_id"]
    assert len(await claim(client, "w2", ["q"], max_jobs=5)) == 1


async def test_a_key_that_may_not_claim_the_queues_is_refused_before_the_transition(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    async with as_key(client, keys.admin) as admin:
        job = await enqueue(admin, queue="billing.eu")
        await enqueue(admin, queue="emails")
    async with as_key(client, keys.scoped_worker) as scoped:
        [held] = await claim(scoped, "w1", ["billing.eu"])
        assert held["id"] == job["id"]
        problem = await settle(
            scoped,
            "complete",
            "w1",
            lease(held),
            claim_next={"queues": ["billing.eu", "emails"]},
            status=403,
        )
        assert problem["errors"] == [
            {"field": "body.claim_next.queues[1]", "message": "queue outside the key's scopes"}
        ]
        # Nothing was done: the job is still held, the other queue's job still pending.
        async with as_key(client, keys.admin) as admin:
            assert (await get_job(admin, held["id"]))["status"] == "running"
        # Within its scopes the same call does both.
        answer = await settle(
            scoped, "complete", "w1", lease(held), claim_next={"queues": ["billing.eu"]}
        )
        assert answer["results"][0]["status"] == "succeeded"
        assert answer["claimed"] == {"jobs": []}
    async with as_key(client, keys.worker) as worker:
        assert len(await claim(worker, "w2", ["emails"])) == 1


async def test_a_lost_lease_answers_lease_lost_and_the_claim_is_made_all_the_same(
    client: httpx.AsyncClient, clean_db: AsyncEngine
) -> None:
    first = await enqueue(client, queue="q")
    second = await enqueue(client, queue="q")
    [held] = await claim(client, "w1", ["q"])
    stale = {"job_id": held["id"], "lease_id": "00000000-0000-4000-8000-000000000000"}
    answer = await settle(client, "complete", "w1", stale, claim_next={"queues": ["q"]})
    assert answer["results"] == [
        {
            "job_id": first["id"],
            "ok": False,
            "status": None,
            "error": "lease_lost",
            "cancelled": False,
            "timed_out": False,
            "lease_expires_at": None,
            "run_at": None,
        }
    ]
    # The worker's slot is free whatever became of the lease: it gets the next job.
    [got] = answer["claimed"]["jobs"]
    assert got["id"] == second["id"] and got["worker_id"] == "w1"
    # The job whose lease it named is untouched, still held under its real lease.
    job = await get_job(client, first["id"])
    assert job["status"] == "running" and job["lease_id"] == held["lease_id"]


async def test_claim_next_long_polls_after_the_transition_committed(
    database_url: str, clean_db: AsyncEngine
) -> None:
    async with running_app(database_url) as client:
        hub = app_state(client.app).running().hub  # type: ignore[attr-defined]
        job = await enqueue(client, queue="lp")
        [held] = await claim(client, "w1", ["lp"])
        waiting = asyncio.create_task(
            settle(
                client,
                "complete",
                "w1",
                lease(held, result=5),
                claim_next={"queues": ["lp"], "wait_seconds": 15},
            )
        )
        await poll_until(lambda: bool(hub.parked), within=5, what="the claim to park")
        # Committed before the wait: other requests see it, and no transaction is left open.
        assert (await get_job(client, job["id"]))["status"] == "succeeded"
        async with clean_db.connect() as conn:
            open_transactions = (
                await conn.execute(
                    text(
                        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                        " AND state LIKE 'idle in transaction%'"
                    )
                )
            ).scalar_one()
        assert open_transactions == 0
        assert not waiting.done()

        new = await enqueue(client, queue="lp")
        answer = await asyncio.wait_for(waiting, 10)
        assert answer["results"][0]["status"] == "succeeded"
        [got] = answer["claimed"]["jobs"]
        assert got["id"] == new["id"] and got["worker_id"] == "w1"


async def test_claim_next_waits_out_its_wait_with_an_empty_list(
    client: httpx.AsyncClient, clean_db: AsyncEngine
) -> None:
    await enqueue(client, queue="lp")
    [held] = await claim(client, "w1", ["lp"])
    loop = asyncio.get_running_loop()
    started = loop.time()
    answer = await settle(
        client,
        "release",
        "w1",
        lease(held, delay_seconds=60),
        claim_next={"queues": ["lp"], "wait_seconds": 0.3},
    )
    assert loop.time() - started >= 0.25
    assert answer["results"][0]["status"] == "scheduled"
    assert answer["claimed"] == {"jobs": []}


@contextlib.asynccontextmanager
async def doomed_claims(engine: AsyncEngine) -> AsyncIterator[None]:
    """A trigger making PostgreSQL refuse every claim for worker ``doomed`` (nothing else), for
    the span of the block."""
    async with engine.begin() as conn:
        await conn.execute(
            text(
                "CREATE FUNCTION test_doomed_claims() RETURNS trigger LANGUAGE plpgsql AS $$ "
                "BEGIN IF NEW.status = 'running' AND OLD.status <> 'running' "
                "AND NEW.worker_id = 'doomed' THEN "
                "RAISE EXCEPTION 'no claims for doomed' USING ERRCODE = '22023'; END IF; "
                "RETURN NEW; END $$"
            )
        )
        await conn.execute(
            text(
                "CREATE TRIGGER test_doomed_claims BEFORE UPDATE ON jobs FOR EACH ROW "
                "EXECUTE FUNCTION test_doomed_claims()"
            )
        )
    try:
        yield
    finally:
        async with engine.begin() as conn:
            await conn.execute(text("DROP TRIGGER test_doomed_claims ON jobs"))
            await conn.execute(text("DROP FUNCTION test_doomed_claims()"))


async def test_when_the_claim_fails_the_transition_still_stands_and_is_answered(
    database_url: str, clean_db: AsyncEngine
) -> None:
    async with running_app(database_url) as client:
        hub = app_state(client.app).running().hub  # type: ignore[attr-defined]
        a = await enqueue(client, queue="q")
        b = await enqueue(client, queue="q")
        held = {j["id"]: j for j in await claim(client, "doomed", ["q"], max_jobs=2)}
        async with doomed_claims(clean_db):
            c = await enqueue(client, queue="q")

            # Refused inside the transaction: rolled back, and the transition redone alone.
            answer = await settle(
                client, "complete", "doomed", lease(held[a["id"]]), claim_next={"queues": ["q"]}
            )
            [result] = answer["results"]
            assert result["ok"] is True and result["status"] == "succeeded"
            assert answer["claimed"] == {"jobs": []}
            assert answer["claim_error"]["status"] == 422, answer
            assert (await get_job(client, a["id"]))["status"] == "succeeded"
            assert (await get_job(client, c["id"]))["status"] == "pending"

            # Refused in the long-poll, after the commit: the transition's answer stands.
            waiting = asyncio.create_task(
                settle(
                    client,
                    "fail",
                    "doomed",
                    lease(held[b["id"]], error="x", retryable=False),
                    claim_next={"queues": ["lp"], "wait_seconds": 15},
                )
            )
            await poll_until(lambda: bool(hub.parked), within=5, what="the claim to park")
            assert (await get_job(client, b["id"]))["status"] == "dead"
            d = await enqueue(client, queue="lp")
            answer = await asyncio.wait_for(waiting, 10)
            assert answer["results"][0]["status"] == "dead"
            assert answer["claimed"] == {"jobs": []}
            assert answer["claim_error"]["status"] == 422, answer
            assert (await get_job(client, d["id"]))["status"] == "pending"


async def test_a_claim_next_is_recorded_as_a_claim_in_history_and_metrics(
    client: httpx.AsyncClient, clean_db: AsyncEngine
) -> None:
    await enqueue(client, queue="m")
    second = await enqueue(client, queue="m")
    [held] = await claim(client, "w1", ["m"])
    before = await scrape(client)
    answer = await settle(client, "complete", "w1", lease(held), claim_next={"queues": ["m"]})
    assert [j["id"] for j in answer["claimed"]["jobs"]] == [second["id"]]
    after = await scrape(client)
    moved = {k: after_v - events(before, "m")[k] for k, after_v in events(after, "m").items()}
    assert {k: v for k, v in moved.items() if v} == {"completed": 1, "claimed": 1}

    r = await client.get(f"/v1/jobs/{second['id']}/events")
    assert r.status_code == 200, r.text
    claims = [e for e in r.json()["events"] if e["kind"] == "claimed"]
    assert [(c["actor"], c["attempt"]) for c in claims] == [("w1", 1)]


async def test_concurrent_workers_chaining_and_not_each_job_runs_once(
    client: httpx.AsyncClient, clean_db: AsyncEngine
) -> None:
    jobs = 60
    r = await client.post(
        "/v1/jobs/batch", json={"jobs": [{"queue": "c", "type": "t"} for _ in range(jobs)]}
    )
    assert r.status_code == 201, r.text
    got: list[int] = []

    async def run(worker: str, chaining: bool) -> None:
        held = await claim(client, worker, ["c"], max_jobs=2)
        while held:
            got.extend(j["id"] for j in held)
            refs = [lease(j, result=worker) for j in held]
            if chaining:
                answer = await settle(
                    client, "complete", worker, *refs, claim_next={"queues": ["c"], "max_jobs": 2}
                )
                held = answer["claimed"]["jobs"]
            else:
                answer = await settle(client, "complete", worker, *refs)
                held = await claim(client, worker, ["c"], max_jobs=2)
            assert all(result["ok"] for result in answer["results"]), answer

    # Chained calls (one transaction each) beside plain ones (coalesced): no job twice.
    await asyncio.gather(*(run(f"w{n}", chaining=n % 3 != 0) for n in range(6)))
    assert sorted(got) == sorted(set(got)) and len(got) == jobs
    async with clean_db.connect() as conn:
        statuses = (
            await conn.execute(text("SELECT status, count(*) FROM jobs GROUP BY status"))
        ).all()
    assert dict(statuses) == {"succeeded": jobs}


@pytest.mark.parametrize(
    ("op", "fields", "settled_as"),
    [
        ("complete", {}, "succeeded"),
        ("fail", {"error": "x", "retryable": False}, "dead"),
        ("release", {"delay_seconds": 3600}, "scheduled"),
    ],
)
async def test_under_a_concurrency_limit_the_slot_a_settle_frees_goes_to_its_claim(
    client: httpx.AsyncClient,
    clean_db: AsyncEngine,
    op: str,
    fields: dict[str, Any],
    settled_as: str,
) -> None:
    r = await client.put("/v1/limits", json={"scope": "key", "pattern": "k", "max_running": 1})
    assert r.status_code in (200, 201), r.text
    jobs = [await enqueue(client, queue="lim", concurrency_key="k") for _ in range(3)]
    [held] = await claim(client, "w1", ["lim"], max_jobs=3)
    assert held["id"] == jobs[0]["id"]  # one at a time
    for following in jobs[1:]:
        # Full while held: another worker gets nothing ...
        assert await claim(client, "w2", ["lim"]) == []
        # ... and the settle frees the slot for its own claim (after its commit when the
        # statement's own claim could not see it).
        answer = await settle(
            client, op, "w1", lease(held, **fields), claim_next={"queues": ["lim"], "max_jobs": 3}
        )
        assert answer["results"][0]["status"] == settled_as
        [held] = answer["claimed"]["jobs"]
        assert held["id"] == following["id"]
    answer = await settle(client, "complete", "w1", lease(held), claim_next={"queues": ["lim"]})
    assert answer["claimed"] == {"jobs": []}
    r = await client.get("/v1/limits")
    [limit] = r.json()["limits"]
    assert limit["running"] == 0, limit
