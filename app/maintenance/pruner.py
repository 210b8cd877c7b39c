"""The pruner: deletes finished jobs once their retention has passed, and old throughput minutes."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from app.maintenance.runner import BatchLoop
from app.settings import setting_default

PRUNER_INTERVAL_DEFAULT: float = setting_default("pruner_interval_seconds")
PRUNER_BATCH_SIZE_DEFAULT: int = setting_default("pruner_batch_size")
SUCCEEDED_RETENTION_DEFAULT: float = setting_default("retention_succeeded_seconds")
CANCELLED_RETENTION_DEFAULT: float = setting_default("retention_cancelled_seconds")
DEAD_RETENTION_DEFAULT: float = setting_default("retention_dead_seconds")
THROUGHPUT_RETENTION_DEFAULT: float = setting_default("retention_throughput_seconds")
WEBHOOK_RETENTION_DEFAULT: float = setting_default("webhook_retention_seconds")
# An ordering key's row (its lock, migration 0021) is deleted this long after its last use, when
# none of its jobs is open; the next enqueue of the key makes it again.
ORDERING_KEY_IDLE_SECONDS = 3600.0


@dataclass(frozen=True)
class PrunerConfig:
    """How long finished jobs are kept (seconds, per final state) and how the pruner paces itself."""

    interval_seconds: float = PRUNER_INTERVAL_DEFAULT
    batch_size: int = PRUNER_BATCH_SIZE_DEFAULT
    succeeded_seconds: float = SUCCEEDED_RETENTION_DEFAULT
    cancelled_seconds: float = CANCELLED_RETENTION_DEFAULT
    dead_seconds: float = DEAD_RETENTION_DEFAULT
    throughput_seconds: float = THROUGHPUT_RETENTION_DEFAULT
    webhook_seconds: float = WEBHOOK_RETENTION_DEFAULT

    def __post_init__(self) -> None:
        if not self.interval_seconds > 0:
            raise ValueError("interval_seconds must be > 0")
        if not 1 <= self.batch_size <= 10_000:
            raise ValueError("batch_size must be within 1..10000")
        for name in ("succeeded_seconds", "cancelled_seconds", "dead_seconds", "webhook_seconds"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0")
        if self.throughput_seconds < 3600:
            raise ValueError("throughput_seconds must be >= 3600 (the dashboard shows an hour)")


@dataclass(frozen=True)
class PruneCounts:
    """What one batch deleted."""

    jobs: int
    throughput_rows: int
    flow_rows: int = 0
    webhook_rows: int = 0
    # Workflows whose steps are all gone, ordering keys idle with no open job (migration 0021).
    composing_rows: int = 0
    # Set-aside jobs that were deleted or left their loop's state (migration 0025).
    set_aside_rows: int = 0


class Pruner(BatchLoop[PrunerConfig]):
    """Deletes finished jobs past retention, one short statement per bounded batch."""

    name = "pruner"
    leader_only = True

    async def run_once(self, *, now: datetime | None = None) -> PruneCounts:
        """Deletes one batch of jobs and one of throughput minutes (as of ``now``)."""
        pruned = await self.services.upkeep.prune(
            batch_size=self.config.batch_size,
            succeeded_seconds=self.config.succeeded_seconds,
            cancelled_seconds=self.config.cancelled_seconds,
            dead_seconds=self.config.dead_seconds,
            now=now,
        )
        minutes = await self.services.upkeep.prune_throughput(
            keep_seconds=self.config.throughput_seconds, batch_size=self.config.batch_size, now=now
        )
        flow_rows = await self.services.limits.prune_state(
            batch_size=self.config.batch_size, now=now
        )
        webhook_rows = await self.services.webhooks.prune(
            batch_size=self.config.batch_size, keep_seconds=self.config.webhook_seconds, now=now
        )
        composing = await self.services.workflows.prune(
            batch_size=self.config.batch_size, idle_key_seconds=ORDERING_KEY_IDLE_SECONDS, now=now
        )
        set_aside = await self.services.upkeep.prune_set_aside(batch_size=self.config.batch_size)
        return PruneCounts(
            jobs=pruned,
            throughput_rows=minutes,
            flow_rows=flow_rows,
            webhook_rows=webhook_rows,
            composing_rows=composing,
            set_aside_rows=set_aside,
        )

    async def run_batch(self) -> int:
        """One batch; answers the larger of the two counts (a full batch means: run again)."""
        counts = await self.run_once()
        return max(
            counts.jobs,
            counts.throughput_rows,
            counts.flow_rows,
            counts.webhook_rows,
            counts.composing_rows,
            counts.set_aside_rows,
        )
