"""The metrics refresh: every few seconds, re-read each queue's depth for ``/metrics``' gauges.

A scrape must not cost the database a query (several Prometheus servers may scrape every
instance), so the gauges show what this loop last read: the trigger-kept ``queue_counts`` rows
and, for each queue's oldest pending job, a probe per pending priority
(``services.ops.queue_stats()``, the same read as ``GET /v1/queues``), the schedules in error
per queue, the limits with their running and held-back jobs, the first 1,000 schedules'
runs, and the jobs the maintenance loops set aside. It runs on every instance, so each one's scrape is complete.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from app.domain.records import FlowLimitUse, QueueStats, Schedule
from app.maintenance.runner import TickLoop
from app.queue.services import Services
from app.settings import setting_default

METRICS_REFRESH_DEFAULT: float = setting_default("metrics_refresh_seconds")
# Schedules with series of their own on /metrics (the first, by name): a bounded scrape.
SCHEDULES_SHOWN = 1000


class QueueGauges(TickLoop):
    """Reads the per-queue counts every interval and keeps the latest for the scrape."""

    name = "metrics"
    leader_only = False

    def __init__(
        self, *, services: Services, interval_seconds: float = METRICS_REFRESH_DEFAULT
    ) -> None:
        super().__init__(services=services, interval_seconds=interval_seconds)
        # One row per queue (name, paused, a count per state, oldest_pending_age_seconds ...);
        # None until the first read.
        self.queues: Sequence[QueueStats] | None = None
        # Schedules in error per queue, as last read (queues without any are absent).
        self.schedules_errored: Mapping[str, int] = {}
        # The limits with their running jobs, the jobs each holds back (by limit id), and the
        # first SCHEDULES_SHOWN schedules by name, as last read.
        self.limits: Sequence[FlowLimitUse] | None = None
        self.held_back: Mapping[int, int] = {}
        self.schedules: Sequence[Schedule] | None = None
        # Jobs each maintenance loop set aside, by (loop, queue), as last read.
        self.set_aside: Mapping[tuple[str, str], int] = {}

    async def run_once(self) -> int:
        """One read; answers how many queues it saw."""
        self.queues = await self.services.ops.queue_stats()
        self.schedules_errored = await self.services.schedules.errored_counts()
        self.limits = await self.services.limits.list_all()
        self.held_back = await self.services.limits.held_back() if self.limits else {}
        self.schedules, _ = await self.services.schedules.list_page(limit=SCHEDULES_SHOWN)
        self.set_aside = await self.services.upkeep.set_aside_counts()
        return len(self.queues)

    async def run_batch(self) -> int:
        """One read (the runner's unit of work)."""
        return await self.run_once()
