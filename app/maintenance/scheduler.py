"""The scheduler: the leader enqueues the due runs of periodic schedules, each exactly once."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime

from app.maintenance.runner import BatchLoop
from app.queue.schedules import SchedulePass
from app.settings import setting_default

logger = logging.getLogger("jobq.maintenance")

SCHEDULER_INTERVAL_DEFAULT: float = setting_default("scheduler_interval_seconds")
SCHEDULER_BATCH_SIZE_DEFAULT: int = setting_default("scheduler_batch_size")


@dataclass(frozen=True)
class SchedulerConfig:
    """How often the scheduler looks for due schedules, and how many one pass handles."""

    interval_seconds: float = SCHEDULER_INTERVAL_DEFAULT
    batch_size: int = SCHEDULER_BATCH_SIZE_DEFAULT

    def __post_init__(self) -> None:
        if not 0 < self.interval_seconds <= 10:
            raise ValueError("interval_seconds must be within (0, 10]")
        if not 1 <= self.batch_size <= 1000:
            raise ValueError("batch_size must be within 1..1000")


class Scheduler(BatchLoop[SchedulerConfig]):
    """Enqueues the due runs of schedules in bounded passes, on the leader.

    Each pass is one transaction (``JobService.enqueue_schedule_runs``): the due schedules are
    locked with ``SKIP LOCKED``, their runs enqueued as jobs marked with the schedule and the run's
    instant (one job per mark), and the schedules moved on with a conditional UPDATE. A leader change, or two
    instances running this at once, can therefore neither lose a committed pass nor double a
    run. A run is enqueued within about one interval of its time (plus the failover time after
    a leader dies; runs missed meanwhile are caught up within each schedule's ``catch_up``).
    """

    name = "scheduler"
    leader_only = True

    async def run_once(self, *, now: datetime | None = None) -> SchedulePass:
        """One pass (as of ``now``, default the database's now()); logs skipped runs and the
        schedules it parked."""
        outcome = await self.services.schedules.enqueue_runs(
            batch_size=self.config.batch_size, now=now
        )
        for skipped in outcome.skipped:
            logger.warning(
                "schedule %s missed more runs than its catch_up (%d): runs due from %s until %s "
                "were skipped",
                skipped.name,
                skipped.catch_up,
                skipped.since.isoformat(),
                skipped.until.isoformat(),
                extra={"event": "schedule.skipped", "schedule": skipped.name},
            )
        for name, reason in outcome.failed:
            logger.error(
                "schedule %s could not be planned and is parked until changed or resumed: %s",
                name,
                reason,
                extra={"event": "schedule.failed", "schedule": name},
            )
        return outcome

    async def run_batch(self) -> int:
        """One pass; answers the schedules moved on."""
        return (await self.run_once()).schedules
