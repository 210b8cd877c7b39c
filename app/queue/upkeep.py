"""The maintenance statements the background loops run: reap, promote, prune, and the backstop's count.

Each is one bounded batch in its own unit of work (app/maintenance/ holds the loops that call
them, one class per loop). What a batch changed is announced like any other change.

A batch that fails in a way a retry would repeat (bad data, a constraint, a program limit such
as the stack depth, an exception raised by a trigger: :class:`~app.errors.StatementFailed`) is
done again one job at a time, each in its own transaction. A job that fails alone too is set
aside (``maintenance_set_aside``, with the error) and left out of the loop's batches until an
operator puts it back, so one poisoned job never stops the loop for every other queue; the
set-aside jobs show on ``GET /v1/maintenance/set-aside``, the dashboard and ``/metrics``.
"""

from __future__ import annotations

import functools
import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from typing import TypeVar

from app.domain.maintenance_records import SetAside
from app.domain.records import ReapedJob
from app.domain.types import EnqueueLimits, JobEvent, Retention
from app.errors import StatementFailed, statement_failures
from app.queue.events import Events
from app.store import Stores
from app.store.conn import Conn
from app.store.unit import UnitOfWork

logger = logging.getLogger("jobq.maintenance")

T = TypeVar("T")


class UpkeepService:
    """Reaps expired leases, promotes due scheduled jobs, prunes old history, folds the counters,
    keeps the statistics of jobs fresh where autovacuum does not, counts due jobs."""

    def __init__(self, *, unit: UnitOfWork, stores: Stores, events: Events) -> None:
        self.unit = unit
        self.stores = stores
        self.events = events

    async def publish_enqueue_limits(self, limits: EnqueueLimits) -> None:
        """Writes the bounds ``jobq.enqueue()`` checks, so SQL producers meet the API's rules."""
        async for attempt in self.unit.ops():
            async with attempt as conn:
                await self.stores.producers.enqueue_limits_set(conn, limits=limits)

    async def reap(self, *, batch_size: int, now: datetime | None = None) -> list[ReapedJob]:
        """Returns at most ``batch_size`` expired leases to the queue (or to dead); answers them.

        A batch that fails for good is done again one job at a time; a job that fails alone is
        set aside (see the module's docstring)."""
        jobs = self.stores.maintenance
        reaped = await self._isolating(
            "reaper",
            batch=lambda conn: jobs.job_reap(conn, batch_size=batch_size, now=now),
            candidates=lambda conn: jobs.job_reap_candidates(conn, batch_size=batch_size, now=now),
            one=lambda conn, job_id: jobs.job_reap_one(conn, job_id=job_id, now=now),
        )
        self.events.publish(
            [JobEvent("reaped", r.id, r.queue, status=r.status, type=r.type) for r in reaped]
        )
        self.events.wake_queues(r.queue for r in reaped if r.freed_flow)
        return reaped

    async def promote(self, *, batch_size: int, now: datetime | None = None) -> int:
        """Moves at most ``batch_size`` due scheduled jobs to pending and announces them (a job
        that fails alone is set aside, as the reaper's)."""
        jobs = self.stores.maintenance

        async def batch(conn: Conn) -> list[str]:
            return list((await jobs.job_promote(conn, batch_size=batch_size, now=now)).elements())

        async def one(conn: Conn, job_id: int) -> list[str]:
            return list((await jobs.job_promote_one(conn, job_id=job_id, now=now)).elements())

        promoted = Counter(
            await self._isolating(
                "promoter",
                batch=batch,
                candidates=lambda conn: jobs.job_promote_candidates(
                    conn, batch_size=batch_size, now=now
                ),
                one=one,
            )
        )
        for queue, count in promoted.items():
            self.events.wake(queue, count)
        return sum(promoted.values())

    async def prune(
        self,
        *,
        batch_size: int,
        succeeded_seconds: float,
        cancelled_seconds: float,
        dead_seconds: float,
        now: datetime | None = None,
    ) -> int:
        """Deletes at most ``batch_size`` finished jobs past their retention; answers how many
        (a job that fails alone is set aside, as the reaper's)."""
        jobs = self.stores.maintenance
        kept = Retention(succeeded_seconds, cancelled_seconds, dead_seconds)

        async def batch(conn: Conn) -> list[int]:
            return [await jobs.job_prune(conn, batch_size=batch_size, now=now, **kept.params())]

        async def one(conn: Conn, job_id: int) -> list[int]:
            return [await jobs.job_prune_one(conn, job_id=job_id, retention=kept, now=now)]

        pruned = await self._isolating(
            "pruner",
            batch=batch,
            candidates=lambda conn: jobs.job_prune_candidates(
                conn, batch_size=batch_size, retention=kept, now=now
            ),
            one=one,
        )
        return sum(pruned)

    async def _ops(self, work: Callable[[Conn], Awaitable[T]]) -> T:
        """``work`` in one unit of work on the engine (retried on deadlock)."""
        async for attempt in self.unit.ops():
            async with attempt as conn:
                result = await work(conn)
        return result

    async def _isolating(
        self,
        loop: str,
        *,
        batch: Callable[[Conn], Awaitable[list[T]]],
        candidates: Callable[[Conn], Awaitable[list[tuple[int, str]]]],
        one: Callable[[Conn, int], Awaitable[list[T]]],
    ) -> list[T]:
        """Runs ``batch``; if it fails for good, runs ``one`` for each of the batch's
        ``candidates`` in turn, each in its own unit of work, and sets aside each job that fails
        alone. Other errors (a lost connection, a deadlock) pass to the loop's runner, which
        tries the batch again later."""
        try:
            with statement_failures():
                return await self._ops(batch)
        except StatementFailed as failed:
            logger.warning(
                "%s: a batch failed (%s, SQLSTATE %s); trying its jobs one at a time",
                loop,
                failed.detail,
                failed.sqlstate,
            )
        done: list[T] = []
        for job_id, queue in await self._ops(candidates):
            try:
                with statement_failures():
                    done.extend(await self._ops(functools.partial(_with_id, one, job_id)))
            except StatementFailed as failed:
                await self._set_aside(loop, job_id, queue, failed)
        return done

    async def _set_aside(self, loop: str, job_id: int, queue: str, failed: StatementFailed) -> None:
        logger.error(
            "%s: job %d (queue %s) fails even alone and is set aside until an operator puts "
            "it back: %s (SQLSTATE %s)",
            loop,
            job_id,
            queue,
            failed.detail,
            failed.sqlstate,
        )
        await self._ops(
            lambda conn: self.stores.maintenance.set_aside_record(
                conn,
                loop=loop,
                job_id=job_id,
                queue=queue,
                error=failed.detail,
                sqlstate=failed.sqlstate,
            )
        )

    async def set_aside(
        self, *, limit: int, queue_patterns: Sequence[str] | None = None
    ) -> list[SetAside]:
        """The jobs the loops set aside, newest failure first; with ``queue_patterns`` (LIKE),
        only those of matching queues."""
        async for attempt in self.unit.ops():
            async with attempt as conn:
                rows = await self.stores.maintenance.set_aside_list(
                    conn, limit=limit, queue_patterns=queue_patterns
                )
        return rows

    async def set_aside_of_job(self, job_id: int) -> list[SetAside]:
        """The loops that set one job aside (none, mostly)."""
        async for attempt in self.unit.ops():
            async with attempt as conn:
                rows = await self.stores.maintenance.set_aside_of_job(conn, job_id=job_id)
        return rows

    async def set_aside_counts(self) -> dict[tuple[str, str], int]:
        """How many jobs each loop has set aside now, by (loop, queue)."""
        async for attempt in self.unit.ops():
            async with attempt as conn:
                counts = await self.stores.maintenance.set_aside_counts(conn)
        return counts

    async def put_back(
        self, *, loop: str, job_id: int, actor: str, actor_key_id: int | None = None
    ) -> SetAside | None:
        """Puts a set-aside job back into its loop's batches (audited); ``None`` when that loop
        had not set it aside."""
        async for attempt in self.unit.ops():
            async with attempt as conn:
                row = await self.stores.maintenance.set_aside_put_back(
                    conn, loop=loop, job_id=job_id, actor=actor, actor_key_id=actor_key_id
                )
        return row

    async def prune_set_aside(self, *, batch_size: int) -> int:
        """Forgets at most ``batch_size`` set-aside jobs that were deleted or have left the
        state their loop moves jobs out of; answers how many."""
        async for attempt in self.unit.ops():
            async with attempt as conn:
                pruned = await self.stores.maintenance.set_aside_prune(conn, batch_size=batch_size)
        return pruned

    async def prune_throughput(
        self, *, keep_seconds: float, batch_size: int, now: datetime | None = None
    ) -> int:
        """Deletes at most ``batch_size`` per-minute outcome rows older than ``keep_seconds``."""
        async for attempt in self.unit.ops():
            async with attempt as conn:
                pruned = await self.stores.queues.queue_throughput_prune(
                    conn, keep_seconds=keep_seconds, batch_size=batch_size, now=now
                )
        return pruned

    async def fold_counters(self, *, lock_timeout_ms: int) -> int | None:
        """Turns the counter journals over to their other slot, then folds the slot left behind
        into the sums and truncates it; answers the rows folded, or None when transactions still
        appending to that slot held it past ``lock_timeout_ms`` (the next pass tries again)."""
        # Two units: the turn must be committed before the fold locks the old slot, or every
        # new appender would still pick that slot and queue behind the lock.
        async for attempt in self.unit.ops():
            async with attempt as conn:
                await self.stores.queues.counter_journal_turn(conn)
        async for attempt in self.unit.ops():
            async with attempt as conn:
                folded = await self.stores.queues.counter_journal_fold(
                    conn, lock_timeout_ms=lock_timeout_ms
                )
        return folded

    async def refresh_statistics(self) -> bool:
        """ANALYZEs ``jobs`` when autovacuum will not and enough of it changed; answers whether
        it did."""
        async for attempt in self.unit.ops():
            async with attempt as conn:
                due = await self.stores.control.jobs_analyze_due(conn)
                if due:
                    await self.stores.control.jobs_analyze(conn)
        return due

    async def due_in_queues(self, queues: Sequence[str], *, cap: int) -> dict[str, int]:
        """Per unpaused queue, how many jobs are due now (up to ``cap``)."""
        async for attempt in self.unit.ops():
            async with attempt as conn:
                due = await self.stores.jobs.job_due_in_queues(conn, queues=queues, cap=cap)
        return due


async def _with_id(
    one: Callable[[Conn, int], Awaitable[list[T]]], job_id: int, conn: Conn
) -> list[T]:
    return await one(conn, job_id)
