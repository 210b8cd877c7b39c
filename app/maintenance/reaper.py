"""The reaper: running jobs whose lease expired go back to pending (with backoff) or to dead."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy.ext.asyncio import AsyncEngine

from app.maintenance.runner import run_batches
from app.queue.repository import Repository

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


class Reaper:
    """Returns expired leases to the queue in bounded batches; safe when two instances run it."""

    name = "reaper"

    def __init__(
        self, *, engine: AsyncEngine, repository: Repository, config: ReaperConfig
    ) -> None:
        self.engine = engine
        self.repo = repository
        self.config = config

    @property
    def interval_seconds(self) -> float:
        """Seconds between runs."""
        return self.config.interval_seconds

    async def run_once(self) -> ReapCounts:
        """Reaps one batch in its own transaction."""
        async with self.engine.begin() as conn:
            rows = await self.repo.job_reap(conn, batch_size=self.config.batch_size)
        dead = sum(1 for r in rows if r["status"] == "dead")
        return ReapCounts(
            retried=len(rows) - dead, dead=dead, queues=frozenset(r["queue"] for r in rows)
        )

    async def run_until_drained(self) -> int:
        """Runs batches until one comes back short; answers the jobs moved."""

        async def batch() -> int:
            return (await self.run_once()).total

        return await run_batches(batch, batch_size=self.config.batch_size)
