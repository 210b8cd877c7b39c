"""jobq behind PgBouncer in transaction pool mode: why the statement cache must be off, and that it works.

PgBouncer 1.18 (Debian bookworm) keeps no prepared statements across transactions: a statement a
client prepared and cached lives on one server session, and the client's next transaction may
run on another. The negative control shows the failure with jobq's own pool factory; the rest
runs the whole job lifecycle and a cross-instance long-poll wake-up through real ``jobq serve``
processes whose DATABASE_URL is PgBouncer and whose direct URL (control connection: LISTEN and
the leader lock) is the server.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import asyncpg
import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from app.db import create_driver_pool, create_engine, driver_dsn
from tests.acceptance.helpers import claim, lease, lease_call
from tests.polling import poll_until
from tests.processes import JobqServer, JobqServers, clean_environment, free_port
from tests.system.pgbouncer.conftest import Bouncer

pytestmark = pytest.mark.acceptance

CLIENTS = 8  # more than the server pool: client sessions share and switch server sessions
ROUNDS = 30
QUERIES = [f"SELECT $1::int + {n}" for n in range(4)]
# PostgreSQL's answers when a cached statement is missing on, or collides with, a server session.
STATEMENT_ERRORS = (
    asyncpg.exceptions.InvalidSQLStatementNameError,  # prepared statement ... does not exist
    asyncpg.exceptions.DuplicatePreparedStatementError,  # prepared statement ... already exists
)
# The long-poll backstop so slow that only a notification wakes a parked claim in time.
SLOW_BACKSTOP = "20"
WAKE_WITHIN_SECONDS = 5.0


async def _statements_on_pool(pool: Any) -> list[BaseException]:
    """Runs the same few statements from every connection of the pool; answers the errors."""
    errors: list[BaseException] = []

    async def client(n: int) -> None:
        async with pool.acquire() as conn:
            for i in range(ROUNDS):
                try:
                    value = await conn.fetchval(QUERIES[(n + i) % len(QUERIES)], i)
                except STATEMENT_ERRORS as exc:
                    errors.append(exc)
                else:
                    assert value == i + (n + i) % len(QUERIES)
                await asyncio.sleep(0)

    await asyncio.gather(*(client(n) for n in range(CLIENTS)))
    return errors


async def test_statement_cache_on_fails_through_transaction_pooling(pgbouncer: Bouncer) -> None:
    """The negative control: with the cache on, cached statements go missing; off, none does."""
    cached = await create_driver_pool(pgbouncer.url, size=CLIENTS, statement_cache=True)
    try:
        errors = await _statements_on_pool(cached)
    finally:
        await cached.close()
    assert errors, "the statement cache worked through transaction pooling: this test is void"
    assert all("prepared statement" in str(e) for e in errors), errors[:3]

    uncached = await create_driver_pool(pgbouncer.url, size=CLIENTS, statement_cache=False)
    try:
        assert await _statements_on_pool(uncached) == []
    finally:
        await uncached.close()


async def test_engine_statement_cache_through_transaction_pooling(pgbouncer: Bouncer) -> None:
    """SQLAlchemy's engine: cache on, its named statements break; off, they are unnamed and work."""

    async def run(statement_cache: bool) -> list[BaseException]:
        engine = create_engine(
            pgbouncer.url,
            pool_size=CLIENTS,
            max_overflow=0,
            pool_timeout=10,
            statement_cache=statement_cache,
        )
        errors: list[BaseException] = []

        async def client(n: int) -> None:
            for i in range(ROUNDS // 3):
                try:
                    async with engine.connect() as conn:
                        query = text(f"SELECT CAST(:v AS int) + {(n + i) % 4}")
                        await conn.execute(query, {"v": i})
                except DBAPIError as exc:
                    errors.append(exc)

        try:
            await asyncio.gather(*(client(n) for n in range(CLIENTS)))
        finally:
            await engine.dispose()
        return errors

    broken = await run(statement_cache=True)
    assert broken, "the engine's statement cache worked through transaction pooling"
    assert all("prepared statement" in str(e) for e in broken), broken[:3]
    assert await run(statement_cache=False) == []


def _env(bouncer: Bouncer, **extra: str) -> dict[str, str]:
    return {
        "DATABASE_URL": bouncer.url,
        "JOBQ_DIRECT_DATABASE_URL": bouncer.direct_url,
        "JOBQ_DB_STATEMENT_CACHE": "false",
        "JOBQ_REAPER_INTERVAL_SECONDS": "0.2",
        **extra,
    }


async def _serve(jobq_servers: JobqServers, env: dict[str, str]) -> JobqServer:
    """A ready ``jobq serve``, migrating (a no-op by then) through the direct URL as it starts."""
    registry = jobq_servers.registry
    name = f"jobq-{len(jobq_servers.servers) + 1}"
    server = JobqServer(
        name=name,
        port=free_port(),
        env=clean_environment(env),
        log_path=registry._log_path(name),
    )
    registry.children.append(server)
    await server.wait_ready()
    return server


async def _start_two(jobq_servers: JobqServers, bouncer: Bouncer) -> tuple[JobqServer, JobqServer]:
    first = await _serve(jobq_servers, _env(bouncer))
    second = await _serve(jobq_servers, _env(bouncer, JOBQ_LONGPOLL_BACKSTOP_SECONDS=SLOW_BACKSTOP))
    return first, second


async def _enqueue(client: httpx.AsyncClient, queue: str, **fields: Any) -> dict[str, Any]:
    r = await client.post("/v1/jobs", json={"queue": queue, "type": "t", "payload": {}, **fields})
    assert r.status_code == 201, r.text
    job: dict[str, Any] = r.json()
    return job


async def test_job_lifecycle_through_pgbouncer(
    pgbouncer: Bouncer, jobq_servers: JobqServers
) -> None:
    """Enqueue, claim, heartbeat, complete; fail to dead; retry; the reaper; all through PgBouncer."""
    first, second = await _start_two(jobq_servers, pgbouncer)
    async with (
        httpx.AsyncClient(base_url=first.url, timeout=30) as a,
        httpx.AsyncClient(base_url=second.url, timeout=30) as b,
    ):
        done = await _enqueue(a, "life")
        doomed = await _enqueue(a, "life", max_attempts=1)
        [got] = await claim(b, "w1", "life", max_jobs=1)
        assert got["id"] == done["id"]
        [beat] = await lease_call(a, "heartbeat", "w1", [lease(got, lease_seconds=30)])
        assert beat["ok"] is True
        [completed] = await lease_call(b, "complete", "w1", [lease(got, result={"n": 1})])
        assert completed == {**completed, "ok": True, "status": "succeeded"}

        [second_job] = await claim(a, "w2", "life", max_jobs=1)
        assert second_job["id"] == doomed["id"]
        [failed] = await lease_call(
            b, "fail", "w2", [lease(second_job, error="boom", retryable=True)]
        )
        assert failed == {**failed, "ok": True, "status": "dead"}
        r = await a.post(f"/v1/jobs/{doomed['id']}/retry")
        assert r.status_code == 200 and r.json()["status"] == "pending", r.text
        [again] = await claim(b, "w3", "life", max_jobs=1)
        assert again["id"] == doomed["id"]
        [ok] = await lease_call(a, "complete", "w3", [lease(again)])
        assert ok["ok"] is True

        # The reaper (leader only, elected on the direct connection) returns an expired lease.
        reaped = await _enqueue(b, "reap")
        [short] = await claim(a, "w4", "reap", max_jobs=1, lease_seconds=1)
        assert short["id"] == reaped["id"]

        async def back_to_pending() -> bool:
            r = await b.get(f"/v1/jobs/{reaped['id']}")
            return bool(r.json()["status"] == "pending")

        await poll_until(back_to_pending, within=10, what="the reaper to return the job")

        # Reads on the engine (SQLAlchemy) through the pooler.
        r = await a.get("/v1/jobs", params={"queue": "life"})
        assert r.status_code == 200, r.text
        assert {j["status"] for j in r.json()["jobs"]} == {"succeeded"}
        r = await b.get("/v1/queues")
        assert r.status_code == 200, r.text

    # The leader lock is a session lock of a control connection on the server itself.
    conn = await asyncpg.connect(driver_dsn(pgbouncer.direct_url))
    try:
        leaders = await conn.fetchval(
            "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid) "
            "WHERE l.locktype = 'advisory' AND l.granted AND a.application_name = 'jobq-control'"
        )
    finally:
        await conn.close()
    assert leaders == 1
    for server in (first, second):
        assert "prepared statement" not in server.log_text(), server.log_text()


async def test_long_poll_woken_through_other_instance(
    pgbouncer: Bouncer, jobq_servers: JobqServers
) -> None:
    """A claim parked on one instance is woken by an enqueue through the other (LISTEN direct)."""
    first, second = await _start_two(jobq_servers, pgbouncer)
    async with (
        httpx.AsyncClient(base_url=first.url, timeout=30) as a,
        httpx.AsyncClient(base_url=second.url, timeout=30) as b,
    ):
        parked = asyncio.create_task(claim(b, "waiter", "lp", max_jobs=1, wait_seconds=15))

        async def is_parked() -> bool:
            return "jobq_claims_waiting 1.0" in (await b.get("/metrics")).text

        await poll_until(is_parked, within=10, what="the claim to park")
        assert not parked.done()
        job = await _enqueue(a, "lp")
        started = time.monotonic()
        [woken] = await asyncio.wait_for(parked, WAKE_WITHIN_SECONDS)
        assert woken["id"] == job["id"]
        assert time.monotonic() - started < WAKE_WITHIN_SECONDS
