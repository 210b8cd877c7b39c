"""The reaper: running jobs whose lease expired go back to pending (with backoff) or to dead."""

from __future__ import annotations

from dataclasses import dataclass

from app.maintenance.runner import BatchLoop

REAPER_INTERVAL_DEFAULT = 1.0
REAPER_BATCH_SIZE_DEFAULT = 500


@dataclass(frozen=True)
class ReaperConfig:
    """How often the reaper runs and how many leases one batch may take."""

    interval_seconds: float = REAPER_INTERVAL_DEFAULT
    batch_size: int = REAPER_BATCH_SIZE_DEFAULT

    def __post_init__(self) -> None:
        if not self.interval_seconds > 0:
            raise ValueError("interval_seconds must be > 0")
        if not 1 <= self.batch_size <= 10_000:
            raise ValueError("batch_size must be within 1..10000")


@dataclass(frozen=True)
class ReapCounts:
    """What one batch did."""

    retried: int
    dead: int
    queues: frozenset[str]

    @property
    def total(self) -> int:
        """Jobs moved by the batch."""
        return self.retried + self.dead


class Reaper(BatchLoop[ReaperConfig]):
    """Returns expired leases to the queue in bounded batches; safe when two instances run it."""

    name = "reaper"

    async def run_once(self) -> ReapCounts:
        """Reaps one batch in its own transaction."""
        async with self.engine.begin() as conn:
            rows = await self.repo.job_reap(conn, batch_size=self.config.batch_size)
        dead = sum(1 for r in rows if r["status"] == "dead")
        return ReapCounts(
            retried=len(rows) - dead, dead=dead, queues=frozenset(r["queue"] for r in rows)
        )

    async def run_batch(self) -> int:
        """One batch; answers the jobs moved."""
        return (await self.run_once()).total
