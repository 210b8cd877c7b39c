"""Queue operations as units of work: one conditional statement in autocommit, or one transaction."""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import hashlib
import json
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import UTC
from typing import Any, TypeVar

from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from app.errors import IdempotencyKeyReused, InvalidInput, InvalidTransition, NotFound, sqlstate
from app.queue.repository import JobRow, LeaseOutcome, ListFilter, Repository
from app.queue.states import JobStatus, VisibleStatus, can_cancel
from app.schemas import MAX_BIGINT, EnqueueRequest
from app.settings import Settings
from app.wakeup.hub import WaiterHub

Announce = Callable[[str, int], object]

T = TypeVar("T")

# Deadlock and serialization failures are safe to retry: the transaction changed nothing.
_RETRYABLE_SQLSTATES = frozenset({"40P01", "40001"})
_TRANSACTION_TRIES = 3


def request_fingerprint(request: EnqueueRequest) -> str:
    """A stable hash of an enqueue request (without its key), to tell a replay from a reuse."""
    body = request.model_dump(mode="json", exclude={"idempotency_key"})
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def encode_cursor(job_id: int) -> str:
    """An opaque keyset cursor for the listing."""
    return base64.urlsafe_b64encode(f"v1:{job_id}".encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> int:
    """The job id behind a cursor; a malformed one is a 422 naming ``after``."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode("ascii")
        version, _, value = raw.partition(":")
        job_id = int(value)
        if version != "v1" or not 1 <= job_id <= MAX_BIGINT + 1:
            raise ValueError(raw)
    except (ValueError, UnicodeDecodeError, binascii.Error):
        raise InvalidInput(
            "malformed cursor", errors=[{"field": "query.after", "message": "malformed cursor"}]
        ) from None
    return job_id


def _valid_id(job_id: int) -> bool:
    return 1 <= job_id <= MAX_BIGINT


class JobService:
    """The queue's operations for the API: enqueue, read, claim, lease transitions, ops actions."""

    def __init__(
        self,
        *,
        engine: AsyncEngine,
        repository: Repository,
        settings: Settings,
        hub: WaiterHub | None = None,
        announce: Announce | None = None,
    ) -> None:
        self.engine = engine
        self.repo = repository
        self.settings = settings
        # Single-statement work runs in autocommit: one round trip instead of BEGIN, statement,
        # COMMIT. Each statement is atomic on its own; see _run.
        self.autocommit_engine = engine.execution_options(isolation_level="AUTOCOMMIT")
        self.hub = hub or WaiterHub()
        # Called after a commit that made jobs claimable: wakes waiters here and elsewhere.
        self.announce: Announce = announce or self.hub.notify

    async def _run(
        self, work: Callable[[AsyncConnection], Awaitable[T]], *, transaction: bool = False
    ) -> T:
        """Runs a unit of work, retrying deadlocks and serialization failures.

        ``transaction=True`` wraps it in one transaction (commit at the end), for work whose
        statements must stand or fall together. Otherwise each statement commits on its own:
        right for the state changes, which are single conditional statements, and for reads.
        """
        for attempt in range(1, _TRANSACTION_TRIES + 1):
            try:
                if transaction:
                    async with self.engine.begin() as conn:
                        return await work(conn)
                async with self.autocommit_engine.connect() as conn:
                    return await work(conn)
            except DBAPIError as exc:
                if sqlstate(exc) in _RETRYABLE_SQLSTATES and attempt < _TRANSACTION_TRIES:
                    continue
                raise
        raise AssertionError("unreachable")

    def _enqueue_item(self, request: EnqueueRequest) -> dict[str, Any]:
        run_at = request.run_at
        if run_at is not None and run_at.tzinfo is None:
            run_at = run_at.replace(tzinfo=UTC)
        return {
            "queue": request.queue,
            "type": request.type,
            "payload": request.payload,
            "priority": request.priority,
            "max_attempts": request.max_attempts or self.settings.max_attempts_default,
            "lease_seconds": request.lease_seconds or self.settings.lease_seconds_default,
            "timeout_seconds": request.timeout_seconds,
            "run_at": run_at.isoformat() if run_at is not None else None,
            "delay_seconds": request.delay_seconds,
            "idempotency_key": request.idempotency_key,
            "idempotency_hash": (
                request_fingerprint(request) if request.idempotency_key is not None else None
            ),
        }

    async def enqueue(
        self, requests: Sequence[EnqueueRequest], *, field_prefix: str = "body"
    ) -> list[tuple[JobRow, bool]]:
        """Enqueues jobs in one transaction; answers each job and whether this call created it.

        A job whose idempotency key exists with the same request is answered as it is; with a
        different request the whole call fails and nothing is written.
        """
        items = [self._enqueue_item(r) for r in requests]
        any_keys = any(item["idempotency_key"] is not None for item in items)

        async def work(conn: AsyncConnection) -> list[tuple[JobRow, bool]]:
            rows = await self.repo.job_enqueue(conn, items=items)
            skipped = [i for i, row in enumerate(rows) if row is None]
            existing: Mapping[tuple[str, str], JobRow] = {}
            if skipped:
                keys = [(items[i]["queue"], items[i]["idempotency_key"]) for i in skipped]
                existing = await self.repo.job_get_by_idempotency_keys(conn, keys=keys)
            answered: list[tuple[JobRow, bool]] = []
            for i, row in enumerate(rows):
                if row is not None:
                    answered.append((row, True))
                    continue
                key = (items[i]["queue"], items[i]["idempotency_key"])
                found = existing.get(key)
                if found is None:
                    # The conflicting job was deleted between the two statements: try again.
                    raise _Retry
                if found["idempotency_hash"] != items[i]["idempotency_hash"]:
                    field = (
                        f"{field_prefix}.jobs[{i}].idempotency_key"
                        if field_prefix == "body" and len(requests) > 1
                        else "idempotency_key"
                    )
                    raise IdempotencyKeyReused(
                        f"idempotency key {key[1]!r} of queue {key[0]!r} was used for a "
                        "different request",
                        errors=[{"field": field, "message": "key reused with a different request"}],
                    )
                answered.append((found, False))
            return answered

        for _ in range(_TRANSACTION_TRIES):
            try:
                # Keys need the lookup in the same transaction: a reused key rolls the batch back.
                answered = await self._run(work, transaction=any_keys)
            except _Retry:
                continue
            due = Counter(
                row["queue"]
                for row, created in answered
                if created and row["run_at"] <= row["db_now"]
            )
            for queue, count in due.items():
                self.announce(queue, count)
            return answered
        raise AssertionError("idempotent enqueue kept racing with deletion")

    async def get(self, job_id: int) -> JobRow:
        """One job; ``NotFound`` for unknown or out-of-range ids."""
        if not _valid_id(job_id):
            raise NotFound(f"job {job_id} not found")

        async def work(conn: AsyncConnection) -> JobRow | None:
            return await self.repo.job_get(conn, job_id=job_id)

        row = await self._run(work)
        if row is None:
            raise NotFound(f"job {job_id} not found")
        return row

    async def list_jobs(
        self,
        *,
        queue: str | None,
        status: VisibleStatus | None,
        type: str | None,
        limit: int,
        after: str | None,
    ) -> tuple[list[JobRow], str | None]:
        """A page of jobs, newest first, and the cursor of the next page (``None`` at the end)."""
        where = ListFilter(
            queue=queue,
            status=status,
            type=type,
            before_id=decode_cursor(after) if after is not None else None,
            limit=limit + 1,
        )

        async def work(conn: AsyncConnection) -> list[JobRow]:
            return await self.repo.job_list(conn, where=where)

        rows = await self._run(work)
        next_cursor = encode_cursor(rows[limit - 1]["id"]) if len(rows) > limit else None
        return rows[:limit], next_cursor

    async def cancel(self, job_id: int) -> JobRow:
        """Cancels a pending or running job; cancelling a cancelled job answers it unchanged."""
        if not _valid_id(job_id):
            raise NotFound(f"job {job_id} not found")

        async def work(conn: AsyncConnection) -> tuple[JobRow | None, JobRow | None]:
            done = await self.repo.job_cancel(conn, job_id=job_id)
            current = None if done is not None else await self.repo.job_get(conn, job_id=job_id)
            return done, current

        done, current = await self._run(work)
        if done is not None:
            return done
        if current is None:
            raise NotFound(f"job {job_id} not found")
        status = JobStatus(current["status"])
        if status is JobStatus.CANCELLED:
            return current
        assert not can_cancel(status)
        raise InvalidTransition(
            f"job {job_id} is {status.value}; only pending or running jobs can be cancelled"
        )

    async def retry(self, job_id: int) -> JobRow:
        """Puts a dead, cancelled or succeeded job back to pending with attempts reset."""
        if not _valid_id(job_id):
            raise NotFound(f"job {job_id} not found")

        async def work(conn: AsyncConnection) -> tuple[JobRow | None, JobRow | None]:
            done = await self.repo.job_retry(conn, job_id=job_id)
            current = None if done is not None else await self.repo.job_get(conn, job_id=job_id)
            return done, current

        done, current = await self._run(work)
        if done is not None:
            self.announce(done["queue"], 1)
            return done
        if current is None:
            raise NotFound(f"job {job_id} not found")
        raise InvalidTransition(
            f"job {job_id} is {current['status']}; only dead, cancelled or succeeded jobs "
            "can be retried"
        )

    async def claim(
        self,
        *,
        worker_id: str,
        queues: Sequence[str],
        max_jobs: int,
        lease_seconds: int | None,
        wait_seconds: float = 0,
        stop: asyncio.Event | None = None,
    ) -> list[JobRow]:
        """Leases up to ``max_jobs`` due jobs; with ``wait_seconds``, long-polls until one comes.

        A waiting claim holds no database connection: it parks in the hub and re-runs the claim
        statement when woken: by an announcement, or by the backstop that checks its queues at
        least every second in case an announcement was lost.
        It answers an empty list when the wait ends, when ``stop`` is set (the client went away)
        or when the instance shuts down.
        """

        async def work(conn: AsyncConnection) -> list[JobRow]:
            return await self.repo.job_claim(
                conn,
                worker_id=worker_id,
                queues=queues,
                max_jobs=max_jobs,
                lease_seconds=lease_seconds,
            )

        if wait_seconds <= 0 or self.hub.closed:
            return await self._run(work)

        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_seconds
        stop = stop or asyncio.Event()
        # Park before the first attempt, so a job announced during it still wakes us.
        waiter = self.hub.register(queues)
        try:
            while True:
                if stop.is_set():
                    return []
                jobs = await self._run(work)
                if jobs and stop.is_set():
                    # The client left while the claim ran: nobody will get these leases, so
                    # hand the jobs straight back (no attempt charged) instead of letting them
                    # wait out the lease.
                    await self._give_back(worker_id, jobs)
                    return []
                if jobs:
                    return jobs
                remaining = deadline - loop.time()
                if remaining <= 0 or self.hub.closed:
                    return []
                # Woken by an announcement, by the instance's once-a-second backstop check
                # (app/wakeup/backstop.py), by the client leaving, or by the deadline.
                await _wait_either(waiter.event, stop, seconds=remaining)
                if self.hub.closed:
                    return []
                self.hub.rearm(waiter)
        finally:
            self.hub.unregister(waiter)
            if waiter.woken and stop.is_set() and not self.hub.closed:
                # Woken but leaving without claiming: pass the wake-up on to another waiter.
                for queue in waiter.queues:
                    self.hub.notify(queue, 1)

    async def _give_back(self, worker_id: str, jobs: Sequence[JobRow]) -> None:
        items = [{"job_id": j["id"], "lease_id": str(j["lease_id"])} for j in jobs]
        await self.lease_call(self.repo.job_release, worker_id=worker_id, items=items)

    async def lease_call(
        self,
        operation: Callable[..., Awaitable[list[LeaseOutcome]]],
        *,
        worker_id: str,
        items: Sequence[Mapping[str, Any]],
    ) -> list[LeaseOutcome]:
        """Runs one of the repository's lease transitions (heartbeat, complete, fail, release)."""

        async def work(conn: AsyncConnection) -> list[LeaseOutcome]:
            outcomes: list[LeaseOutcome] = await operation(conn, worker_id=worker_id, items=items)
            return outcomes

        outcomes = await self._run(work)
        due = Counter(o.queue for o in outcomes if o.claimable_now and o.queue is not None)
        for queue, count in due.items():
            self.announce(queue, count)
        return outcomes

    async def set_paused(self, name: str, *, paused: bool) -> JobRow:
        """Pauses or resumes a queue; resuming wakes the queue's waiters."""

        async def work(conn: AsyncConnection) -> JobRow:
            return await self.repo.queue_set_paused(conn, name=name, paused=paused)

        row = await self._run(work)
        if not paused:
            self.announce(name, RESUME_WAKE_COUNT)
        return row

    async def queue_stats(self) -> list[JobRow]:
        """Counts per queue and state."""
        return await self._run(self.repo.queue_stats)

    async def workers(self) -> list[JobRow]:
        """Workers holding leases now."""
        return await self._run(self.repo.worker_list)

    async def ping(self) -> None:
        """Fails when the database does not answer."""
        await self._run(self.repo.health_ping)


class _Retry(Exception):
    """Internal: the unit of work must run again."""


# Resuming a queue may make its whole backlog claimable: wake every waiter on it.
RESUME_WAKE_COUNT = 1_000_000


async def _wait_either(first: asyncio.Event, second: asyncio.Event, *, seconds: float) -> None:
    """Waits until either event is set or ``seconds`` pass."""
    waits = [asyncio.ensure_future(first.wait()), asyncio.ensure_future(second.wait())]
    try:
        await asyncio.wait(waits, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in waits:
            task.cancel()
        for task in waits:
            with contextlib.suppress(asyncio.CancelledError):
                await task
