"""The systems as the fixed-rate load process (``python -m bench.rate_load``) drives them.

Each target enqueues one job per call from a producer client the load process hands it, and runs
``W`` workers that record, per job, the moment its work starts and the moment it is done:

- :class:`JobqTarget`: `jobq serve` over HTTP (``bench/http.py``). Producers ``POST /v1/jobs``;
  each worker is one keep-alive connection, as ``jobq_client``'s Worker: ``POST /v1/complete``
  for its lease claims its next job in the same request (``claim_next``, ``max_jobs`` 1, no
  wait), and a worker that got none long-polls ``POST /v1/claim`` (``max_jobs`` 1,
  ``wait_seconds`` 5);
- the lean raw-SQL queue, in ``bench/rate_lean.py`` (its own module: its table and statements);
- :class:`PgqueuerTarget`: PGQueuer 1.6 in this process. Producers call ``Queries.enqueue`` with
  one job; each worker is one ``QueueManager`` on its own connection (as ``bench/peers.py``'s
  workers), with ``batch_size`` 1 (so it also acknowledges each job at once) and PGQueuer's
  defaults otherwise: it LISTENs itself (a notification wakes every idle manager) and dequeues
  its next job without waiting for its handler, so W bounds its dequeuers, not jobs in work.

This module also holds what every target shares: the run's :class:`Recorder`, connecting, the
work. The work is ``asyncio.sleep(0.001)``: it holds the worker for 1 ms (a little more: the event
loop's timer) without using the load process's CPU, which busy work at thousands of jobs/s
would saturate. The payload ``{"n": n}`` names the job's place in the schedule.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import math
import time
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any, Protocol

import asyncpg

from bench.common import JOB_TYPE, LEASE_SECONDS, Errors
from bench.http import Connection, HttpError

WORK_SECONDS = 0.001
CLAIM_WAIT_SECONDS = 5.0  # jobq's long-poll; the load cancels parked claims when it is done
RETRY_SECONDS = 0.1  # after a refused or broken claim or complete, before the next try
# When no wake-up comes, an idle lean worker or PGQueuer manager looks again after this long,
# as jobq's parked claims are re-checked (JOBQ_LONGPOLL_BACKSTOP_SECONDS, 1 s by default).
FALLBACK_POLL_SECONDS = 1.0
APPLICATION_NAME = "bench-rate"
# Producer clients a run may open. HTTP connections cost PostgreSQL nothing (jobq's own pool of
# db_pool_size, 10 by default, serves them); a lean or PGQueuer producer is a PostgreSQL
# connection, as many as jobq's pool, so that W = 32 workers, the producers and a test run
# beside it fit in a default max_connections of 100.
PRODUCERS_MAX_HTTP = 32
PRODUCERS_MAX_SQL = 10
CONNECT_PATIENCE_SECONDS = 60.0
CONNECT_RETRY_SECONDS = 0.5


class Recorder:
    """Per scheduled job: when it was due, sent and started; which ids were enqueued and completed.

    Times are ``time.perf_counter()`` of this process. A job is done when its complete was
    answered (jobq, lean) or its handler returned (PGQueuer, which acknowledges in a buffer).
    :attr:`drained` is set once production has ended and every enqueued job is done.
    """

    def __init__(self, jobs: int, errors: Errors) -> None:
        self.errors = errors
        self.scheduled = [math.nan] * jobs
        self.sent = [math.nan] * jobs
        self.started = [math.nan] * jobs
        self.started_twice = 0
        self.enqueued_ids: list[int] = []
        self.completed_ids: list[int] = []
        self.window_end = math.inf  # set when the schedule starts
        self.completed_in_window = 0
        self.producing = True
        self.drained = asyncio.Event()

    def start(self, n: int) -> None:
        """Job ``n``'s work starts now."""
        if not 0 <= n < len(self.started):
            self.errors.add(f"a worker was given job number {n}, never scheduled")
        elif math.isnan(self.started[n]):
            self.started[n] = time.perf_counter()
        else:
            self.started_twice += 1
            self.errors.add(f"job number {n} started twice")

    def finish(self, job_id: int) -> None:
        """Job ``job_id`` is done."""
        self.completed_ids.append(job_id)
        if time.perf_counter() <= self.window_end:
            self.completed_in_window += 1
        self._check_drained()

    def enqueued(self, job_id: int) -> None:
        """An enqueue was answered with ``job_id``."""
        self.enqueued_ids.append(job_id)

    def production_ended(self) -> None:
        """Every send has been answered (or has failed)."""
        self.producing = False
        self._check_drained()

    def _check_drained(self) -> None:
        if not self.producing and len(self.completed_ids) >= len(self.enqueued_ids):
            self.drained.set()


class Target(Protocol):
    """One system as the load process drives it."""

    producers_max: int  # producer clients it may open; sends wait for a free one beyond that

    async def open_producer(self, *, patient: bool = False) -> Any:
        """A ready producer client (a connection); ``patient`` before the schedule starts."""

    async def close_producer(self, producer: Any) -> None:
        """Closes a producer client."""

    async def enqueue(self, producer: Any, n: int) -> int | None:
        """Enqueues job number ``n``; its id, or None (the error is recorded) when it failed."""

    def workers(
        self, count: int, recorder: Recorder
    ) -> contextlib.AbstractAsyncContextManager[None]:
        """``count`` workers running for the duration of the block."""


def number(payload: Any) -> int:
    """The schedule number a job's payload carries (JSON text or an object)."""
    value = json.loads(payload) if isinstance(payload, str | bytes) else payload
    return int(value["n"])


async def stop_all(tasks: list[asyncio.Task[None]]) -> None:
    """Cancels the tasks and waits for each to end."""
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


class JobqTarget:
    """`jobq serve` over HTTP: single enqueues, long-polling workers completing one lease each."""

    producers_max = PRODUCERS_MAX_HTTP

    def __init__(self, args: dict[str, Any], errors: Errors) -> None:
        self.base: str = args["base"]
        self.queue: str = args["queue"]
        self.errors = errors

    async def open_producer(self, *, patient: bool = False) -> Connection:
        """A keep-alive connection, opened with ``GET /healthz`` (costs PostgreSQL no slot)."""
        conn = Connection(self.base)
        await conn.get("/healthz")
        return conn

    async def close_producer(self, producer: Connection) -> None:
        """Closes the connection."""
        await producer.close()

    async def enqueue(self, producer: Connection, n: int) -> int | None:
        """``POST /v1/jobs`` with payload ``{"n": n}``."""
        body = {"queue": self.queue, "type": JOB_TYPE, "payload": {"n": n}}
        try:
            response = await producer.post("/v1/jobs", body)
        except HttpError as exc:
            self.errors.add(f"enqueue: {exc}")
            return None
        if response.status != 201:
            self.errors.add(f"enqueue: HTTP {response.status}: {response.body[:300]!r}")
            return None
        return int(response.json()["id"])

    @contextlib.asynccontextmanager
    async def workers(self, count: int, recorder: Recorder) -> AsyncIterator[None]:
        """``count`` long-polling workers, each on its own connection."""
        conns = [Connection(self.base) for _ in range(count)]
        await asyncio.gather(*(conn.get("/healthz") for conn in conns))
        tasks = [asyncio.create_task(self._work(i, c, recorder)) for i, c in enumerate(conns)]
        try:
            yield
        finally:
            await stop_all(tasks)
            await asyncio.gather(*(conn.close() for conn in conns))

    async def _work(self, index: int, conn: Connection, recorder: Recorder) -> None:
        """As ``jobq_client``'s Worker: a complete claims the next job in the same request
        (``claim_next``, no wait); only a worker that got none long-polls a claim of its own."""
        worker_id = f"bench-rate-{index}"
        claim = {
            "worker_id": worker_id,
            "queues": [self.queue],
            "max_jobs": 1,
            "lease_seconds": LEASE_SECONDS,
            "wait_seconds": CLAIM_WAIT_SECONDS,
        }
        claim_next = {"queues": [self.queue], "max_jobs": 1, "lease_seconds": LEASE_SECONDS}
        jobs: list[dict[str, Any]] = []
        while True:
            if not jobs:
                jobs = await self._claim(conn, claim)
                continue
            job = jobs.pop()
            recorder.start(number(job["payload"]))
            await asyncio.sleep(WORK_SECONDS)
            lease = {"job_id": job["id"], "lease_id": job["lease_id"]}
            jobs = await self._complete(conn, worker_id, lease, claim_next, recorder)

    async def _claim(self, conn: Connection, claim: dict[str, Any]) -> list[dict[str, Any]]:
        """A long-polled claim's jobs (none after a pause when it failed)."""
        try:
            response = await conn.post("/v1/claim", claim, time_limit=CLAIM_WAIT_SECONDS + 30)
        except HttpError as exc:
            self.errors.add(f"claim: {exc}")
            await asyncio.sleep(RETRY_SECONDS)
            return []
        if response.status != 200:
            self.errors.add(f"claim: HTTP {response.status}: {response.body[:300]!r}")
            await asyncio.sleep(RETRY_SECONDS)
            return []
        jobs: list[dict[str, Any]] = response.json()["jobs"]
        return jobs

    async def _complete(
        self,
        conn: Connection,
        worker_id: str,
        lease: dict[str, Any],
        claim_next: dict[str, Any],
        recorder: Recorder,
    ) -> list[dict[str, Any]]:
        """Completes the lease; the jobs its ``claim_next`` claimed."""
        body = {"worker_id": worker_id, "leases": [lease], "claim_next": claim_next}
        try:
            response = await conn.post("/v1/complete", body)
        except HttpError as exc:
            self.errors.add(f"complete: {exc}")
            return []
        if response.status != 200:
            self.errors.add(f"complete: HTTP {response.status}: {response.body[:300]!r}")
            return []
        answer = response.json()
        for item in answer["results"]:
            if item["ok"] and item["status"] == "succeeded":
                recorder.finish(int(item["job_id"]))
            else:
                self.errors.add(f"complete answered {item}")
        if answer.get("claim_error") is not None:
            self.errors.add(f"complete's claim_next: {answer['claim_error']}")
        claimed: list[dict[str, Any]] = answer["claimed"]["jobs"]
        return claimed


async def connect(dsn: str, system: str, *, patient: bool = False) -> Any:
    """One asyncpg connection, named ``bench-rate-<system>`` in ``pg_stat_activity``.

    ``patient`` (before the schedule starts) retries for up to :data:`CONNECT_PATIENCE_SECONDS`
    while the server has no connection slot free: on a server shared with other work, the W = 32
    runs may start while someone else's connections come and go.
    """
    name = f"{APPLICATION_NAME}-{system}"
    deadline = time.monotonic() + (CONNECT_PATIENCE_SECONDS if patient else 0.0)
    while True:
        try:
            return await asyncpg.connect(dsn, server_settings={"application_name": name})
        except asyncpg.TooManyConnectionsError:
            if time.monotonic() >= deadline:
                raise
            await asyncio.sleep(CONNECT_RETRY_SECONDS)


class PgqueuerTarget:
    """PGQueuer in process: ``Queries.enqueue`` per job; W QueueManagers taking one job at a time."""

    producers_max = PRODUCERS_MAX_SQL

    def __init__(self, args: dict[str, Any], errors: Errors) -> None:
        self.dsn: str = args["dsn"]
        self.errors = errors

    async def open_producer(self, *, patient: bool = False) -> tuple[Any, Any]:
        """PGQueuer's ``Queries`` on an asyncpg connection of its own, and that connection."""
        from pgqueuer import AsyncpgDriver, Queries

        conn = await connect(self.dsn, "pgqueuer", patient=patient)
        return Queries(AsyncpgDriver(conn)), conn

    async def close_producer(self, producer: tuple[Any, Any]) -> None:
        """Closes the connection under the driver (PGQueuer's driver leaves it open)."""
        await producer[1].close()

    async def enqueue(self, producer: tuple[Any, Any], n: int) -> int | None:
        """``Queries.enqueue(entrypoint, payload)``: one job, one statement (its trigger notifies)."""
        try:
            ids = await producer[0].enqueue(JOB_TYPE, json.dumps({"n": n}).encode())
        except (asyncpg.PostgresError, OSError) as exc:
            self.errors.add(f"enqueue: {exc!r}")
            return None
        return int(ids[0])

    @contextlib.asynccontextmanager
    async def workers(self, count: int, recorder: Recorder) -> AsyncIterator[None]:
        """``count`` QueueManagers on a connection each, ``batch_size`` 1, PGQueuer's defaults else."""
        from pgqueuer import AsyncpgDriver, Job, Queries

        async def handle(job: Job) -> None:
            recorder.start(number(job.payload))
            await asyncio.sleep(WORK_SECONDS)
            recorder.finish(int(job.id))

        conns = list(
            await asyncio.gather(
                *(connect(self.dsn, "pgqueuer", patient=True) for _ in range(count))
            )
        )
        managers = [checked_once_manager()(Queries(AsyncpgDriver(conn))) for conn in conns]
        for manager in managers:
            manager.entrypoint(JOB_TYPE, accepts_context=False)(handle)
        # PGQueuer's schema check (some 15 catalog queries) runs here, not in the schedule.
        await asyncio.gather(*(manager.verify_structure() for manager in managers))
        runs = [
            asyncio.create_task(
                manager.run(dequeue_timeout=timedelta(seconds=FALLBACK_POLL_SECONDS), batch_size=1)
            )
            for manager in managers
        ]
        try:
            yield
        finally:
            # Shutdown lets the jobs in hand finish and flushes the buffered acknowledgements.
            for manager in managers:
                manager.shutdown.set()
            for outcome in await asyncio.gather(*runs, return_exceptions=True):
                if isinstance(outcome, BaseException):
                    self.errors.add(f"QueueManager.run: {outcome!r}")
            await asyncio.gather(*(conn.close() for conn in conns))


@functools.cache
def checked_once_manager() -> type[Any]:
    """PGQueuer's ``QueueManager`` whose start-up schema check runs once, before the schedule."""
    from pgqueuer import QueueManager

    class CheckedOnce(QueueManager):  # type: ignore[misc]
        """``run()`` opens with ``verify_structure()``; a second call does nothing."""

        verified = False

        async def verify_structure(self) -> None:
            """PGQueuer's own check the first time; nothing after."""
            if not self.verified:
                await super().verify_structure()
                self.verified = True

    return CheckedOnce
