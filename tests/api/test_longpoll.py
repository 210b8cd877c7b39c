"""Long-polling claims: instant wake-up, delayed jobs on time, no connection held while parked."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.api.state import app_state
from tests.api.helpers import claim, enqueue, running_app
from tests.polling import poll_until


def parked(client: httpx.AsyncClient) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return bool(app_state(client.app).running().hub.parked)  # type: ignore[attr-defined]

    return check


async def test_waiting_claim_returns_job_as_soon_as_it_is_enqueued(
    database_url: str, clean_db: AsyncEngine
) -> None:
    async with running_app(database_url) as client:
        started = time.monotonic()
        waiting = asyncio.create_task(claim(client, queues=["lp"], wait_seconds=10))
        await poll_until(parked(client), within=5)
        job = await enqueue(client, queue="lp")
        [got] = await waiting
        assert got["id"] == job["id"]
        assert time.monotonic() - started < 5


async def test_waiting_claim_answers_empty_list_when_wait_ends(
    database_url: str, clean_db: AsyncEngine
) -> None:
    async with running_app(database_url) as client:
        started = time.monotonic()
        assert await claim(client, queues=["lp"], wait_seconds=0.5) == []
        assert 0.45 <= time.monotonic() - started < 3


async def test_release_fail_and_resume_wake_waiters(
    database_url: str, clean_db: AsyncEngine
) -> None:
    async with running_app(database_url) as client:
        await enqueue(client, queue="lp")
        [held] = await claim(client, queues=["lp"])
        waiting = asyncio.create_task(claim(client, worker="w2", queues=["lp"], wait_seconds=10))
        await poll_until(parked(client), within=5)
        ref = {"job_id": held["id"], "lease_id": held["lease_id"]}
        r = await client.post("/v1/release", json={"worker_id": "w1", "leases": [ref]})
        assert r.json()["results"][0]["ok"]
        [again] = await asyncio.wait_for(waiting, 5)
        assert again["id"] == held["id"]

        await client.post("/v1/queues/lp/pause")
        await enqueue(client, queue="lp")
        waiting = asyncio.create_task(claim(client, worker="w3", queues=["lp"], wait_seconds=10))
        await poll_until(parked(client), within=5)
        await client.post("/v1/queues/lp/resume")
        assert len(await asyncio.wait_for(waiting, 5)) == 1


async def test_delayed_job_is_handed_out_on_time_not_before(
    database_url: str, clean_db: AsyncEngine
) -> None:
    async with running_app(database_url, maintenance_enabled=True) as client:
        job = await enqueue(client, queue="lp", delay_seconds=1.5)
        got = await claim(client, queues=["lp"], wait_seconds=10)
        async with clean_db.connect() as conn:
            late = (
                await conn.execute(
                    text("SELECT EXTRACT(EPOCH FROM started_at - run_at) FROM jobs WHERE id = :id"),
                    {"id": job["id"]},
                )
            ).scalar_one()
        assert [j["id"] for j in got] == [job["id"]]
        assert 0 <= float(late) < 1.0, late


async def test_a_job_enqueued_on_one_instance_wakes_a_claim_parked_on_another(
    database_url: str, clean_db: AsyncEngine
) -> None:
    async with running_app(database_url) as a, running_app(database_url) as b:
        started = time.monotonic()
        waiting = asyncio.create_task(claim(b, queues=["lp"], wait_seconds=15))
        await poll_until(parked(b), within=5)
        job = await enqueue(a, queue="lp")
        [got] = await asyncio.wait_for(waiting, 10)
        assert got["id"] == job["id"] and time.monotonic() - started < 5


async def test_listener_killed_reconnects_and_still_wakes(
    database_url: str, clean_db: AsyncEngine
) -> None:
    async with running_app(database_url) as a, running_app(database_url) as b:
        control = app_state(b.app).running().control  # type: ignore[attr-defined]
        async with clean_db.begin() as conn:
            killed = (
                await conn.execute(
                    text(
                        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                        "WHERE application_name = 'jobq-control' AND datname = current_database()"
                    )
                )
            ).scalar_one()
        assert killed >= 2

        async def reconnected() -> bool:
            return bool(control.connected)

        await poll_until(reconnected, within=10)
        waiting = asyncio.create_task(claim(b, queues=["lp"], wait_seconds=15))
        await poll_until(parked(b), within=5)
        job = await enqueue(a, queue="lp")
        [got] = await asyncio.wait_for(waiting, 10)
        assert got["id"] == job["id"]


async def test_parked_claims_hold_no_pooled_connections(
    database_url: str, clean_db: AsyncEngine
) -> None:
    pool_size, read_pool = 4, 2
    async with running_app(
        database_url, db_pool_size=pool_size, db_read_pool_size=read_pool, db_max_overflow=0
    ) as client:
        waiting = [
            asyncio.create_task(claim(client, worker=f"w{i}", queues=["lp"], wait_seconds=15))
            for i in range(200)
        ]

        async def all_parked() -> bool:
            return bool(app_state(client.app).running().hub.parked == 200)  # type: ignore[attr-defined]

        await poll_until(all_parked, within=20)
        async with clean_db.connect() as conn:
            backends = (
                await conn.execute(
                    text(
                        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                        " AND application_name IN ('jobq', 'jobq-control')"
                    )
                )
            ).scalar_one()
        assert backends <= pool_size + read_pool + 1, backends
        # Five jobs wake about five waiters, and each job goes to exactly one of them.
        await client.post("/v1/jobs/batch", json={"jobs": [{"queue": "lp", "type": "t"}] * 5})

        async def five_answered() -> bool:
            return sum(t.done() for t in waiting) >= 5

        await poll_until(five_answered, within=10)
        app_state(client.app).running().hub.close()  # type: ignore[attr-defined]
        results = await asyncio.gather(*waiting)
        got = [j["id"] for r in results for j in r]
        assert sorted(got) == sorted(set(got)) and len(got) == 5


async def test_client_that_went_away_claims_nothing(
    database_url: str, clean_db: AsyncEngine
) -> None:
    async with running_app(database_url) as client:
        app: FastAPI = client.app  # type: ignore[attr-defined]
        gone = asyncio.Event()
        body = b'{"worker_id": "ghost", "queues": ["lp"], "wait_seconds": 15}'
        sent: list[dict[str, Any]] = []
        delivered = False

        async def receive() -> dict[str, Any]:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            await gone.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "POST",
            "scheme": "http",
            "path": "/v1/claim",
            "raw_path": b"/v1/claim",
            "query_string": b"",
            "root_path": "",
            "server": ("jobq.test", 80),
            "client": ("127.0.0.1", 5000),
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
        ghost = asyncio.create_task(app(scope, receive, send))
        await poll_until(parked(client), within=5)
        gone.set()

        async def unparked() -> bool:
            return not app_state(app).running().hub.parked

        await poll_until(unparked, within=5)
        job = await enqueue(client, queue="lp")
        await asyncio.wait_for(ghost, 5)
        [got] = await claim(client, worker="alive", queues=["lp"])
        assert got["id"] == job["id"] and got["attempt"] == 1


@pytest.mark.parametrize("wait_seconds", [0, 20])
async def test_wait_seconds_bounds(client: httpx.AsyncClient, wait_seconds: int) -> None:
    # 0 answers at once; the maximum is accepted (and the hub is closed, so it returns now).
    client_app = client._transport.app  # type: ignore[attr-defined]
    app_state(client_app).running().hub.close()
    assert await claim(client, queues=["none"], wait_seconds=wait_seconds) == []


async def test_backstop_finds_a_job_whose_wake_up_was_lost(
    database_url: str, clean_db: AsyncEngine
) -> None:
    # Announcements off: every wake-up is "lost"; only the one-second backstop can find the job.
    async with running_app(
        database_url, wakeup_announce=False, longpoll_backstop_seconds=0.5
    ) as client:
        started = time.monotonic()
        waiting = asyncio.create_task(claim(client, queues=["lp"], wait_seconds=15))
        await poll_until(parked(client), within=5)
        job = await enqueue(client, queue="lp")
        [got] = await asyncio.wait_for(waiting, 10)
        assert got["id"] == job["id"]
        assert time.monotonic() - started < 3


async def test_backstop_wakes_only_queues_with_due_jobs(
    database_url: str, clean_db: AsyncEngine
) -> None:
    async with running_app(database_url, wakeup_announce=False) as client:
        app: FastAPI = client.app  # type: ignore[attr-defined]
        from app.wakeup.backstop import Backstop

        service = app_state(app).running().services
        backstop = Backstop(services=service, hub=app_state(app).running().hub)
        empty = app_state(app).running().hub.register(["empty"])
        busy = [app_state(app).running().hub.register(["busy"]) for _ in range(3)]
        await enqueue(client, queue="busy")
        await enqueue(client, queue="busy")
        assert await backstop.run_once() == 2
        assert [w.woken for w in busy] == [True, True, False] and not empty.woken


async def test_jobs_claimed_as_the_client_leaves_are_given_back(
    database_url: str, clean_db: AsyncEngine
) -> None:
    async with running_app(database_url) as client:
        app: FastAPI = client.app  # type: ignore[attr-defined]
        service = app_state(app).running().services
        gone = asyncio.Event()
        real_claim = service.jobs.stores.jobs.job_claim

        async def claim_then_client_leaves(*args: Any, **kwargs: Any) -> Any:
            outcome = await real_claim(*args, **kwargs)
            if any(outcome.by_slot):  # one entry per slot, None where no job was due
                gone.set()  # the disconnect lands while the claim statement ran
            return outcome

        service.jobs.stores.jobs.job_claim = claim_then_client_leaves
        waiting = asyncio.create_task(
            service.jobs.claim(
                worker_id="ghost",
                queues=["lp"],
                max_jobs=5,
                lease_seconds=60,
                wait_seconds=10,
                stop=gone,
            )
        )
        await poll_until(parked(client), within=5)
        job = await enqueue(client, queue="lp")
        assert await asyncio.wait_for(waiting, 5) == []
        service.jobs.stores.jobs.job_claim = real_claim
        [got] = await claim(client, worker="alive", queues=["lp"])
        assert got["id"] == job["id"] and got["attempt"] == 1


async def test_a_batch_with_keys_wakes_a_parked_claim_only_after_it_committed(
    database_url: str, clean_db: AsyncEngine
) -> None:
    # A batch with idempotency keys is one transaction; a waiter woken before its COMMIT would
    # claim nothing and sleep until the (slow) backstop. Woken after it, it gets a job at once.
    async with running_app(database_url) as client:
        for round_ in range(5):
            queue = f"keyed{round_}"  # leftovers of a round must not answer the next one
            waiting = asyncio.create_task(claim(client, queues=[queue], wait_seconds=15))
            await poll_until(parked(client), within=5)
            jobs = [{"queue": queue, "type": "t", "idempotency_key": f"k{n}"} for n in range(3)]
            r = await client.post("/v1/jobs/batch", json={"jobs": jobs})
            assert r.status_code == 201, r.text
            got = await asyncio.wait_for(waiting, 5)
            assert len(got) == 1
