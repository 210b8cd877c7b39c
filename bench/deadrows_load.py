"""The loads ``python -m bench.deadrows`` puts on jobq (bare HTTP loops) and on the lean table (raw SQL).

A drain enqueues N jobs first, then W workers claim one job at a time and complete it until a
claim comes back empty. A steady run offers R jobs/s for S seconds (job ``n`` is sent at
``t0 + n / R`` on a free producer connection) while W workers claim one job at a time and
complete it, and ends when every job sent is done; meanwhile :class:`DeadSampler` reads the
dead tuples of every table once a second (the figures the issue's author watched from outside).
Each load answers the ids it enqueued and the ids it completed, for ``bench/checks.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg

from bench import baseline
from bench.common import JOB_TYPE, LEASE_SECONDS, Errors
from bench.http import Connection, HttpError

QUEUE = "deadrows"
ENQUEUE_BATCH = 500
ENQUEUE_CLIENTS = 4
STEADY_PRODUCERS = 8
LONG_POLL_SECONDS = 1  # an idle jobq worker waits in the server, not in a loop here
LEAN_IDLE_SECONDS = 0.005  # an idle lean worker's pause before it claims again
FINISH_TIMEOUT_SECONDS = 300.0
DEAD_SAMPLE_SECONDS = 1.0
DEAD_TOTAL = "SELECT coalesce(sum(n_dead_tup), 0)::bigint FROM pg_stat_user_tables"


class DeadSampler:
    """Reads the sum of ``n_dead_tup`` over the database's tables every second while running."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.samples: list[int] = []
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        conn = await asyncpg.connect(
            self.dsn, server_settings={"application_name": "bench-sampler"}
        )
        try:
            next_at = time.monotonic()
            while True:
                await conn.execute("SELECT pg_stat_clear_snapshot()")
                self.samples.append(int(await conn.fetchval(DEAD_TOTAL)))
                next_at += DEAD_SAMPLE_SECONDS
                await asyncio.sleep(max(0.0, next_at - time.monotonic()))
        finally:
            await conn.close()

    def start(self) -> None:
        """Starts sampling."""
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> dict[str, Any]:
        """Stops sampling; answers the samples' median and maximum."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        samples = self.samples
        return {
            "samples": len(samples),
            "median": statistics.median(samples) if samples else None,
            "max": max(samples) if samples else None,
        }


class Tally:
    """What a load did: ids enqueued, ids completed, errors; and whether all sent are done."""

    def __init__(self) -> None:
        self.created: list[int] = []
        self.completed: list[int] = []
        self.errors = Errors()
        self.producing = True
        self._ended_at = 0.0

    def production_ended(self) -> None:
        """No more jobs will be sent."""
        self.producing = False
        self._ended_at = time.monotonic()

    def done(self, job_ids: list[int]) -> None:
        """Records completions."""
        self.completed.extend(job_ids)

    def finished(self) -> bool:
        """Production is over and every job sent is done."""
        return not self.producing and len(self.completed) >= len(self.created)

    def overdue(self) -> bool:
        """Production ended :data:`FINISH_TIMEOUT_SECONDS` ago and jobs are still not done: a
        worker gives up (recording it) rather than wait for jobs that will never come."""
        if self.producing or time.monotonic() - self._ended_at < FINISH_TIMEOUT_SECONDS:
            return False
        left = len(self.created) - len(self.completed)
        self.errors.add(
            f"{left} jobs not done {FINISH_TIMEOUT_SECONDS:g} s after the last was sent"
        )
        return True


async def paced(
    rate: float, seconds: float, send: Callable[[int], Awaitable[None]], producers: int
) -> None:
    """Calls ``send(n)`` at ``t0 + n / rate`` for ``rate * seconds`` jobs, ``producers`` at most at once."""
    free = asyncio.Semaphore(producers)
    jobs = round(rate * seconds)
    t0 = time.monotonic()

    async def one(n: int) -> None:
        try:
            await send(n)
        finally:
            free.release()

    async with asyncio.TaskGroup() as group:
        for n in range(jobs):
            await asyncio.sleep(max(0.0, t0 + n / rate - time.monotonic()))
            await free.acquire()
            group.create_task(one(n))


# --- jobq, over HTTP -------------------------------------------------------------------------


async def _jobq_worker(base: str, index: int, tally: Tally, *, wait: float) -> None:
    """Claims one job and completes it until a claim comes back empty with production over."""
    conn = Connection(base)
    worker_id = f"deadrows-{index}"
    claim = {
        "worker_id": worker_id,
        "queues": [QUEUE],
        "max_jobs": 1,
        "lease_seconds": LEASE_SECONDS,
        "wait_seconds": wait,
    }
    try:
        while True:
            response = await conn.post("/v1/claim", claim)
            if response.status != 200:
                tally.errors.add(f"claim: HTTP {response.status}: {response.body[:200]!r}")
                return
            taken = response.json()["jobs"]
            if not taken:
                if tally.finished() or (not tally.producing and wait == 0) or tally.overdue():
                    return
                continue
            leases = [{"job_id": j["id"], "lease_id": j["lease_id"]} for j in taken]
            response = await conn.post("/v1/complete", {"worker_id": worker_id, "leases": leases})
            if response.status != 200:
                tally.errors.add(f"complete: HTTP {response.status}: {response.body[:200]!r}")
                return
            items = response.json()["results"]
            for item in items:
                if not (item["ok"] and item["status"] == "succeeded"):
                    tally.errors.add(f"complete answered {item}")
            tally.done([item["job_id"] for item in items if item["ok"]])
    except HttpError as exc:
        tally.errors.add(f"worker {index}: {exc}")
    finally:
        await conn.close()


async def jobq_drain(
    base: str, jobs: int, workers: int, tally: Tally, after_enqueue: Callable[[], Awaitable[None]]
) -> None:
    """N jobs through ``POST /v1/jobs/batch`` (500 a request), then W workers until empty."""
    numbers = iter(range(jobs))

    async def producer() -> None:
        conn = Connection(base)
        try:
            while chunk := [n for _, n in zip(range(ENQUEUE_BATCH), numbers, strict=False)]:
                body = {
                    "jobs": [{"queue": QUEUE, "type": JOB_TYPE, "payload": {"n": n}} for n in chunk]
                }
                response = await conn.post("/v1/jobs/batch?answer=ids", body)
                if response.status != 201:
                    tally.errors.add(f"enqueue: HTTP {response.status}: {response.body[:200]!r}")
                    continue
                tally.created.extend(response.json()["ids"])
        except HttpError as exc:
            tally.errors.add(f"enqueue: {exc}")
        finally:
            await conn.close()

    await asyncio.gather(*(producer() for _ in range(ENQUEUE_CLIENTS)))
    tally.production_ended()
    await after_enqueue()
    await asyncio.gather(*(_jobq_worker(base, i, tally, wait=0) for i in range(workers)))


async def jobq_steady(base: str, rate: float, seconds: float, workers: int, tally: Tally) -> None:
    """R jobs/s through ``POST /v1/jobs`` for S seconds, W long-polling workers, until all done."""
    conns = [Connection(base) for _ in range(STEADY_PRODUCERS)]
    idle = list(conns)

    async def send(n: int) -> None:
        conn = idle.pop()
        try:
            response = await conn.post(
                "/v1/jobs", {"queue": QUEUE, "type": JOB_TYPE, "payload": {"n": n}}
            )
            if response.status != 201:
                tally.errors.add(f"enqueue: HTTP {response.status}: {response.body[:200]!r}")
            else:
                tally.created.append(response.json()["id"])
        except HttpError as exc:
            tally.errors.add(f"enqueue: {exc}")
        finally:
            idle.append(conn)

    async def produce() -> None:
        try:
            await paced(rate, seconds, send, STEADY_PRODUCERS)
        finally:
            tally.production_ended()
            await asyncio.gather(*(conn.close() for conn in conns))

    async with asyncio.TaskGroup() as group:
        group.create_task(produce())
        for i in range(workers):
            group.create_task(_jobq_worker(base, i, tally, wait=LONG_POLL_SECONDS))


# --- the lean table, raw SQL -----------------------------------------------------------------


async def _lean_worker(conn: Any, index: int, tally: Tally, *, stop_when_empty: bool) -> None:
    worker_id = f"deadrows-lean-{index}"
    while True:
        try:
            rows = await conn.fetch(baseline.CLAIM, QUEUE, 1, worker_id)
            if not rows:
                if stop_when_empty or tally.finished() or tally.overdue():
                    return
                await asyncio.sleep(LEAN_IDLE_SECONDS)
                continue
            ids = [row["id"] for row in rows]
            status = await conn.execute(baseline.COMPLETE, ids, [row["lease_id"] for row in rows])
        except asyncpg.PostgresError as exc:
            tally.errors.add(f"lean worker {index}: {exc!r}")
            return
        if status != f"UPDATE {len(ids)}":
            tally.errors.add(f"complete of {len(ids)} answered {status!r}")
            return
        tally.done(ids)


async def lean_drain(
    admin: Any,
    dsn: str,
    jobs: int,
    workers: int,
    tally: Tally,
    after_enqueue: Callable[[], Awaitable[None]],
) -> None:
    """N rows by 500-row INSERTs on ``admin``, then W connections claim and complete until empty."""
    loaded = await baseline.insert_batches(admin, queue=QUEUE, jobs=jobs, batch=ENQUEUE_BATCH)
    for error in loaded["errors"]:
        tally.errors.add(error)
    tally.created.extend(row["id"] for row in await admin.fetch("SELECT id FROM jobs"))
    tally.production_ended()
    await after_enqueue()
    conns = await baseline.connect_all(dsn, workers, "bench-deadrows")
    try:
        await asyncio.gather(
            *(_lean_worker(c, i, tally, stop_when_empty=True) for i, c in enumerate(conns))
        )
    finally:
        await baseline.close_all(conns)


async def lean_steady(dsn: str, rate: float, seconds: float, workers: int, tally: Tally) -> None:
    """R single-row INSERTs a second for S seconds, W polling connections, until all done."""
    producers = await baseline.connect_all(dsn, STEADY_PRODUCERS, "bench-deadrows")
    conns = await baseline.connect_all(dsn, workers, "bench-deadrows")
    idle = list(producers)

    async def send(n: int) -> None:
        conn = idle.pop()
        try:
            tally.created.append(
                await conn.fetchval(
                    baseline.INSERT_ONE,
                    QUEUE,
                    JOB_TYPE,
                    baseline.payload(n),
                    baseline.MAX_ATTEMPTS,
                    LEASE_SECONDS,
                )
            )
        except asyncpg.PostgresError as exc:
            tally.errors.add(f"insert: {exc!r}")
        finally:
            idle.append(conn)

    async def produce() -> None:
        try:
            await paced(rate, seconds, send, STEADY_PRODUCERS)
        finally:
            tally.production_ended()

    try:
        await asyncio.gather(
            produce(),
            *(_lean_worker(c, i, tally, stop_when_empty=False) for i, c in enumerate(conns)),
        )
    finally:
        await baseline.close_all(producers + conns)
