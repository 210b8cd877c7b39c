"""The pruner: deletes finished jobs once their retention has passed, in small batches."""

from __future__ import annotations

from dataclasses import dataclass

from app.maintenance.runner import BatchLoop

PRUNER_INTERVAL_DEFAULT = 60.0
PRUNER_BATCH_SIZE_DEFAULT = 1000
SUCCEEDED_RETENTION_DEFAULT = 7 * 24 * 3600.0
CANCELLED_RETENTION_DEFAULT = 7 * 24 * 3600.0
DEAD_RETENTION_DEFAULT = 30 * 24 * 3600.0


@dataclass(frozen=True)
class PrunerConfig:
    """How long finished jobs are kept (seconds, per final state) and how the pruner paces itself."""

    interval_seconds: float = PRUNER_INTERVAL_DEFAULT
    batch_size: int = PRUNER_BATCH_SIZE_DEFAULT
    succeeded_seconds: float = SUCCEEDED_RETENTION_DEFAULT
    cancelled_seconds: float = CANCELLED_RETENTION_DEFAULT
    dead_seconds: float = DEAD_RETENTION_DEFAULT

    def __post_init__(self) -> None:
        if not self.interval_seconds > 0:
            raise ValueError("interval_seconds must be > 0")
        if not 1 <= self.batch_size <= 10_000:
            raise ValueError("batch_size must be within 1..10000")
        for name in ("succeeded_seconds", "cancelled_seconds", "dead_seconds"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0")


class Pruner(BatchLoop[PrunerConfig]):
    """Deletes finished jobs past retention, one short transaction per bounded batch."""

    name = "pruner"

    async def run_once(self) -> int:
        """Deletes one batch; answers how many jobs it deleted."""
        async with self.engine.begin() as conn:
            return await self.repo.job_prune(
                conn,
                batch_size=self.config.batch_size,
                succeeded_seconds=self.config.succeeded_seconds,
                cancelled_seconds=self.config.cancelled_seconds,
                dead_seconds=self.config.dead_seconds,
            )

    async def run_batch(self) -> int:
        """One batch; answers the jobs deleted."""
        return await self.run_once()
