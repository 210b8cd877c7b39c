"""The checkpointed price-list job survives kill -9 and SIGTERM: every book raised exactly once.

Real processes: ``jobq serve`` and ``jobq worker examples.price_update.worker:worker`` (run as
``python -m app.cli worker ...``), on a books table of its own database.
"""

from __future__ import annotations

import functools
import os
import signal
import sys
from decimal import Decimal
from typing import Any

import asyncpg
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from examples.price_update.books import (
    TABLE,
    asyncpg_dsn,
    create_books,
    expected_total,
    original_price,
    version_counts,
)
from examples.price_update.worker import JOB_TYPE, raise_prices
from jobq_client import Client, JobContext
from tests.polling import poll_until
from tests.processes import ChildProcess, JobqServer, JobqServers, ProcessRegistry

pytestmark = pytest.mark.acceptance

ROWS = 200_000
CHUNK = 20_000
PERCENT = 8
TO_VERSION = 7
QUEUE = "bookstore-test"
# A pause between chunks stretches the job to a few seconds, so that the test can act at ~40 %
# while the job still runs (chunks alone take ~0.1 s each here).
PAUSE_SECONDS = 0.15
# The SIGTERM test's job must outlast the second worker's start and its probe (seconds on a busy
# machine): had the first worker finished first, it would take the probe itself. A stopped job
# stops at its next chunk, so the longer pause costs the test only the wait to 40 %.
SIGTERM_PAUSE_SECONDS = 1.0
PAYLOAD = {"percent": PERCENT, "to_version": TO_VERSION, "chunk": CHUNK}
# The reaper ticks every 0.2 s and a reaped job is due again within 0.2 s (first backoff).
SERVER_ENV = {"JOBQ_REAPER_INTERVAL_SECONDS": "0.2", "JOBQ_BACKOFF_BASE_SECONDS": "0.2"}

# Every book whose price is not its original price raised once (the formula of books.py).
MISPRICED_SQL = (
    f"SELECT count(*) FROM {TABLE}"
    " WHERE price <> round(((500 + (id * 7919) % 10000) / 100.0) * $1::numeric, 2)"
)


@functools.cache
def _expected_total() -> Decimal:
    return expected_total(ROWS, PERCENT)


@pytest.fixture
async def books(books_database_url: str) -> str:
    """``bookstore.books`` freshly filled with ROWS books at version 6; answers its asyncpg DSN."""
    dsn = asyncpg_dsn(books_database_url)
    conn = await asyncpg.connect(dsn)
    try:
        await create_books(conn, ROWS)
        # The deterministic formula is what the table holds: the expected totals rest on it.
        total = await conn.fetchval(f"SELECT sum(price) FROM {TABLE}")
        assert total == sum(original_price(i) for i in range(1, ROWS + 1))
    finally:
        await conn.close()
    return dsn


async def _fetch(dsn: str, sql: str, *args: Any) -> Any:
    conn = await asyncpg.connect(dsn)
    try:
        return await conn.fetchval(sql, *args)
    finally:
        await conn.close()


async def _versions(dsn: str) -> dict[int, int]:
    conn = await asyncpg.connect(dsn)
    try:
        return await version_counts(conn)
    finally:
        await conn.close()


async def assert_every_book_raised_once(dsn: str) -> None:
    """All books at the new version; the total and every single price are raised exactly once."""
    assert await _versions(dsn) == {TO_VERSION: ROWS}
    assert await _fetch(dsn, f"SELECT sum(price) FROM {TABLE}") == _expected_total()
    factor = 1 + Decimal(PERCENT) / 100
    assert await _fetch(dsn, MISPRICED_SQL, factor) == 0


def spawn_worker(
    processes: ProcessRegistry, server: JobqServer, dsn: str, *, name: str, lease_seconds: int
) -> ChildProcess:
    """``jobq worker examples.price_update.worker:worker --url ...`` as a child process."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JOBQ_", "PRICE_UPDATE_"))}
    env.update(
        BOOKS_DATABASE_URL=dsn,
        PRICE_UPDATE_QUEUE=QUEUE,
        PRICE_UPDATE_LEASE_SECONDS=str(lease_seconds),
        PRICE_UPDATE_WORKER_ID=name,
    )
    argv = [sys.executable, "-m", "app.cli", "worker", "examples.price_update.worker:worker"]
    return processes.spawn(name, [*argv, "--url", server.url], env)


async def test_kill_9_at_40_percent_resumes_from_the_checkpoint_after_the_lease(
    jobq_servers: JobqServers, clean_db: AsyncEngine, processes: ProcessRegistry, books: str
) -> None:
    server = await jobq_servers.start(env=SERVER_ENV)
    async with Client(server.url) as client:
        job = await client.enqueue(
            JOB_TYPE, {**PAYLOAD, "pause_seconds": PAUSE_SECONDS}, queue=QUEUE, max_attempts=3
        )
        # A short lease, so that the job comes back soon after the worker dies.
        first = spawn_worker(processes, server, books, name="price-1", lease_seconds=2)

        async def at_40_percent() -> bool:
            nonlocal job
            assert first.process.poll() is None, "the first worker exited on its own"
            job = await client.get_job(job["id"])
            assert job["status"] in ("pending", "running"), job
            return bool(job["checkpoint"]) and job["checkpoint"]["last_id"] >= 0.4 * ROWS

        await poll_until(at_40_percent, within=30, interval=0.02, what="40 % checkpointed")
        first.process.kill()
        assert await first.wait_exit(within=5) == -signal.SIGKILL

        async def reaped() -> bool:
            nonlocal job
            job = await client.get_job(job["id"])
            return bool(job["status"] != "running")

        # The lease (2 s) runs out and the reaper hands the job back with its checkpoint.
        await poll_until(reaped, within=10, interval=0.05, what="the reaper to return the job")
        assert job["status"] in ("pending", "scheduled"), job
        assert job["attempts"] == 1, job
        assert [e["kind"] for e in job["errors"]] == ["lease_expired"], job["errors"]
        checkpoint = job["checkpoint"]["last_id"]
        assert 0.4 * ROWS <= checkpoint < ROWS, job
        # Nobody works on the books now. The killed attempt may have committed one chunk past its
        # checkpoint (killed between the chunk's commit and the checkpoint): the window the
        # guard price_list_version < 7 makes harmless.
        done_before = (await _versions(books)).get(TO_VERSION, 0)
        assert done_before in (checkpoint, min(checkpoint + CHUNK, ROWS)), done_before

        spawn_worker(processes, server, books, name="price-2", lease_seconds=30)

        async def finished() -> bool:
            nonlocal job
            job = await client.get_job(job["id"])
            return job["status"] in ("succeeded", "dead", "cancelled")

        await poll_until(finished, within=30, interval=0.05, what="the second worker to finish")

    assert (job["status"], job["attempts"], job["worker_id"]) == ("succeeded", 2, "price-2"), job
    result = job["result"]
    # The second attempt started at the checkpoint, not at id 0, and changed exactly the rows the
    # first one had not: none twice (a repeated chunk matched no row), none skipped.
    assert result["attempt"] == 2
    assert result["started_from"] == checkpoint
    assert result["rows_updated"] == ROWS - done_before
    assert result["last_id"] == ROWS
    # It waited out the 2 s lease: the checkpoint sat idle at least that long before the claim.
    assert result["idle_before_seconds"] >= 2.0, result
    await assert_every_book_raised_once(books)


async def test_sigterm_releases_with_the_checkpoint_and_another_worker_resumes_at_once(
    jobq_servers: JobqServers, clean_db: AsyncEngine, processes: ProcessRegistry, books: str
) -> None:
    server = await jobq_servers.start(env=SERVER_ENV)
    async with Client(server.url) as client:
        job = await client.enqueue(
            JOB_TYPE,
            {**PAYLOAD, "pause_seconds": SIGTERM_PAUSE_SECONDS},
            queue=QUEUE,
            max_attempts=3,
        )
        # A 60 s lease: had the job waited for the lease to expire, the test would time out.
        first = spawn_worker(processes, server, books, name="price-1", lease_seconds=60)

        async def running() -> bool:
            nonlocal job
            job = await client.get_job(job["id"])
            return bool(job["status"] == "running")

        await poll_until(running, within=20, interval=0.02, what="the first worker to claim")
        assert job["worker_id"] == "price-1", job

        # The second worker, parked in a long-poll on the same queue before the first one stops.
        # It has proved it claims once it took (and, lacking a handler, released for later) a
        # probe job: the first worker runs one job at a time, so only the second could take it.
        second = spawn_worker(processes, server, books, name="price-2", lease_seconds=60)
        probe = await client.enqueue("probe", queue=QUEUE)

        async def probe_settled() -> bool:
            nonlocal probe
            probe = await client.get_job(probe["id"])
            return probe["status"] not in ("pending", "running")

        await poll_until(probe_settled, within=20, interval=0.02, what="the second worker")
        assert (probe["status"], probe["worker_id"]) == ("scheduled", "price-2"), probe
        assert probe["attempts"] == 0, "a job without a handler is released, not failed"

        async def at_40_percent() -> bool:
            nonlocal job
            job = await client.get_job(job["id"])
            assert job["status"] == "running", job
            return bool(job["checkpoint"]) and job["checkpoint"]["last_id"] >= 0.4 * ROWS

        await poll_until(at_40_percent, within=30, interval=0.02, what="40 % checkpointed")
        assert job["checkpoint"]["last_id"] < ROWS, job
        first.send_signal(signal.SIGTERM)

        async def finished() -> bool:
            nonlocal job
            job = await client.get_job(job["id"])
            return job["status"] in ("succeeded", "dead", "cancelled")

        # Inside the 60 s lease: only a release lets this finish in time.
        await poll_until(finished, within=40, interval=0.05, what="the second worker to finish")
        assert await first.wait_exit(within=10) == 0, first.log_text()
        assert second.process.poll() is None, second.log_text()

    # Released, not reaped: no error recorded, and the release gave the attempt back.
    assert (job["status"], job["worker_id"], job["errors"]) == ("succeeded", "price-2", []), job
    assert job["attempts"] == 1, job
    result = job["result"]
    started_from = result["started_from"]
    assert 0.4 * ROWS <= started_from < ROWS, result
    # The released checkpoint was exact: the second worker changed every row past it and only
    # those (a stale checkpoint would show fewer rows updated; a checkpoint ahead, missed rows).
    assert result["rows_updated"] == ROWS - started_from, result
    assert result["last_id"] == ROWS
    # Claimed within 1 s of the release (checkpoint_at is stamped by the release itself).
    assert result["idle_before_seconds"] is not None and result["idle_before_seconds"] < 1.0, result
    assert "stopped at id" in first.log_text()
    await assert_every_book_raised_once(books)


async def test_a_checkpoint_one_chunk_behind_the_data_raises_no_price_twice(books: str) -> None:
    """The window between a chunk's commit and its checkpoint: the chunk runs again, harmlessly."""
    factor = 1 + Decimal(PERCENT) / 100
    conn = await asyncpg.connect(books)
    try:
        # What a worker killed after committing chunk 3 but before checkpointing it left behind.
        await conn.execute(
            f"UPDATE {TABLE} SET price = round(price * $1::numeric, 2), price_list_version = $2"
            " WHERE id <= $3",
            factor,
            TO_VERSION,
            3 * CHUNK,
        )
    finally:
        await conn.close()
    job = {"id": 1, "type": JOB_TYPE, "payload": PAYLOAD, "attempt": 2}
    ctx = JobContext({**job, "checkpoint": {"last_id": 2 * CHUNK}})

    result = await raise_prices(ctx, dsn=books)

    assert result["started_from"] == 2 * CHUNK
    assert result["chunks"] == ROWS // CHUNK - 2
    assert result["rows_updated"] == ROWS - 3 * CHUNK  # chunk 3 again: no row matched the guard
    assert ctx.checkpoint == {"last_id": ROWS}
    assert ctx.progress == {"done": ROWS, "total": ROWS}
    await assert_every_book_raised_once(books)
