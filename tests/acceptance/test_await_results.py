"""Awaiting results across real ``jobq serve`` processes: woken within milliseconds, no connection held."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import asyncpg
import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db import driver_dsn
from tests.acceptance.helpers import claim, enqueue_batch, lease, lease_call
from tests.polling import poll_until
from tests.processes import JobqServers

pytestmark = pytest.mark.acceptance

TRIES = 5
# From the complete's HTTP answer (on instance B) to the waiter's answer (on instance A).
WAKE_LATENCY_MAX_SECONDS = 0.050
PARKED = 500
PER_CLIENT = 20
POOL_SIZE, READ_POOL_SIZE = 2, 1
# A backstop far longer than any wait below: an answer that comes early was woken, not polled.
SLOW = {"JOBQ_LONGPOLL_BACKSTOP_SECONDS": "20"}


async def _awaited(engine: AsyncEngine) -> int:
    async with engine.connect() as conn:
        count = await conn.scalar(text("SELECT count(*) FROM jobs WHERE awaited"))
    return int(count or 0)


async def test_a_waiter_on_one_instance_is_answered_within_50_ms_of_a_complete_on_another(
    jobq_servers: JobqServers, clean_db: AsyncEngine
) -> None:
    a, b = await asyncio.gather(jobq_servers.start(SLOW), jobq_servers.start(SLOW))
    latencies: list[float] = []
    async with contextlib.AsyncExitStack() as stack:
        waiter = await stack.enter_async_context(httpx.AsyncClient(base_url=a.url, timeout=30))
        worker = await stack.enter_async_context(httpx.AsyncClient(base_url=b.url, timeout=30))
        # Warm both connections (and the statements on each instance) before measuring.
        for client in (waiter, worker):
            assert (await client.get("/readyz")).status_code == 200
        for attempt in range(TRIES + 1):
            [job] = await enqueue_batch(worker, "rpc", [{"try": attempt}])
            [held] = await claim(worker, "w1", "rpc")

            async def wait_for(job_id: int) -> tuple[httpx.Response, float]:
                r = await waiter.get(f"/v1/jobs/{job_id}", params={"wait_seconds": 15})
                return r, time.monotonic()

            waiting = asyncio.create_task(wait_for(job["id"]))

            async def marked(expected: int = attempt + 1) -> bool:
                return await _awaited(clean_db) == expected

            await poll_until(marked, within=5, what="the waiter to mark its job")
            [done] = await lease_call(worker, "complete", "w1", [lease(held, result=attempt)])
            completed = time.monotonic()
            assert done["ok"] is True and done["status"] == "succeeded"
            response, answered = await asyncio.wait_for(waiting, 5)
            assert response.status_code == 200, response.text
            assert response.json()["status"] == "succeeded"
            assert response.json()["result"] == attempt
            if attempt:  # the first round warms the wait path itself
                latencies.append(answered - completed)
    assert max(latencies) < WAKE_LATENCY_MAX_SECONDS, [f"{s * 1000:.1f} ms" for s in latencies]


async def _backends(dsn: str) -> list[dict[str, Any]]:
    """The client backends on the test database other than this check's own and the tests' pool."""
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch(
            "SELECT pid, application_name, state FROM pg_stat_activity "
            "WHERE datname = current_database() AND backend_type = 'client backend' "
            "AND pid <> pg_backend_pid() AND application_name <> 'jobq-tests'"
        )
    finally:
        await conn.close()
    return [dict(r) for r in rows]


async def test_500_parked_waiters_hold_no_more_connections_than_the_pools(
    jobq_servers: JobqServers, clean_db: AsyncEngine, database_url: str
) -> None:
    server = await jobq_servers.start(
        {
            **SLOW,
            "JOBQ_DB_POOL_SIZE": str(POOL_SIZE),
            "JOBQ_DB_READ_POOL_SIZE": str(READ_POOL_SIZE),
            "JOBQ_DB_MAX_OVERFLOW": "0",
        }
    )
    async with contextlib.AsyncExitStack() as stack:
        control = await stack.enter_async_context(
            httpx.AsyncClient(base_url=server.url, timeout=60)
        )
        # Many small client pools: one httpx pool of 500 connections costs the test itself
        # seconds of CPU per 100 answers (its pool bookkeeping), which is not what is measured.
        limits = httpx.Limits(max_connections=PER_CLIENT, max_keepalive_connections=PER_CLIENT)
        clients = [
            await stack.enter_async_context(
                httpx.AsyncClient(base_url=server.url, timeout=60, limits=limits)
            )
            for _ in range(PARKED // PER_CLIENT)
        ]
        jobs = await enqueue_batch(control, "many", [{"n": n} for n in range(PARKED)])
        waiting = [
            asyncio.create_task(
                clients[n % len(clients)].get(f"/v1/jobs/{job['id']}", params={"wait_seconds": 20})
            )
            for n, job in enumerate(jobs)
        ]

        async def all_parked() -> bool:
            scrape = (await control.get("/metrics")).text
            return (
                f"jobq_results_waiting {float(PARKED)}" in scrape
                and await _awaited(clean_db) == PARKED
            )

        await poll_until(all_parked, within=30, what=f"{PARKED} waiters to park")
        # The test's own pooled connections are not the server's: close them before counting.
        await clean_db.dispose()
        backends = await _backends(driver_dsn(database_url))
        assert len(backends) <= POOL_SIZE + READ_POOL_SIZE + 1, backends
        assert not any(t.done() for t in waiting)

        # Finish them all through the same instance; every waiter is answered.
        started = time.monotonic()
        for _ in range(PARKED // 100):
            held = await claim(control, "w1", "many", max_jobs=100)
            await lease_call(control, "complete", "w1", [lease(j, result=j["id"]) for j in held])
        answers = await asyncio.wait_for(asyncio.gather(*waiting), 20)
        assert all(r.status_code == 200 for r in answers)
        assert {r.json()["status"] for r in answers} == {"succeeded"}
        assert sorted(r.json()["result"] for r in answers) == sorted(j["id"] for j in jobs)
        assert time.monotonic() - started < 15  # not the 20 s wait: they were woken
        scrape = (await control.get("/metrics")).text
        assert "jobq_results_waiting 0.0" in scrape
