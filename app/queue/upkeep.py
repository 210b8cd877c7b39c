"""The maintenance statements the background loops run: reap, promote, prune, and the backstop's count.

Each is one bounded batch in its own unit of work (app/maintenance/ holds the loops that call
them, one class per loop). What a batch changed is announced like any other change.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from datetime import datetime

from app.domain.records import ReapedJob
from app.domain.types import EnqueueLimits, JobEvent
from app.queue.events import Events
from app.store import Stores
from app.store.unit import UnitOfWork


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
        """Returns at most ``batch_size`` expired leases to the queue (or to dead); answers them."""
        async for attempt in self.unit.ops():
            async with attempt as conn:
                reaped = await self.stores.jobs.job_reap(conn, batch_size=batch_size, now=now)
        self.events.publish(
            [JobEvent("reaped", r.id, r.queue, status=r.status, type=r.type) for r in reaped]
        )
        self.events.wake_queues(r.queue for r in reaped if r.freed_flow)
        return reaped

    async def promote(self, *, batch_size: int, now: datetime | None = None) -> int:
        """Moves at most ``batch_size`` due scheduled jobs to pending and announces them."""
        async for attempt in self.unit.ops():
            async with attempt as conn:
                promoted: Counter[str] = await self.stores.jobs.job_promote(
                    conn, batch_size=batch_size, now=now
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
        """Deletes at most ``batch_size`` finished jobs past their retention; answers how many."""
        async for attempt in self.unit.ops():
            async with attempt as conn:
                pruned = await self.stores.jobs.job_prune(
                    conn,
                    batch_size=batch_size,
                    succeeded_seconds=succeeded_seconds,
                    cancelled_seconds=cancelled_seconds,
                    dead_seconds=dead_seconds,
                    now=now,
                )
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

    async def fold_counters(self, *, batch_size: int) -> int:
        """Folds at most ``batch_size`` rows of each counter journal (queue counts, per-minute
        outcomes) into their sums; answers the larger number folded."""
        async for attempt in self.unit.ops():
            async with attempt as conn:
                counts = await self.stores.queues.queue_counts_fold(conn, batch_size=batch_size)
                outcomes = await self.stores.queues.queue_throughput_fold(
                    conn, batch_size=batch_size
                )
        return max(counts, outcomes)

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
