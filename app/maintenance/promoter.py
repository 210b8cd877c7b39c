"""The promoter: announces queues whose delayed jobs (and retries after backoff) just came due."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy.ext.asyncio import AsyncEngine

from app.queue.repository import Repository

PROMOTER_INTERVAL_DEFAULT = 0.05


@dataclass(frozen=True)
class PromoterConfig:
    """How often the promoter looks for jobs that came due."""

    interval_seconds: float = PROMOTER_INTERVAL_DEFAULT

    def __post_init__(self) -> None:
        if not 0 < self.interval_seconds <= 10:
            raise ValueError("interval_seconds must be within (0, 10]")


class Promoter:
    """Each run finds pending jobs whose ``run_at`` passed since the last run and announces their queues.

    It keeps a watermark (the database's ``now()`` of the previous run), so each check reads only
    the jobs that came due in between, through ``ix_jobs_pending_run_at``. A waiting claim thus gets
    a delayed job within about one interval of its ``run_at``; the waiters' one-second backstop
    covers anything this misses (a leader change, a late commit).
    """

    name = "promoter"

    def __init__(
        self,
        *,
        engine: AsyncEngine,
        repository: Repository,
        announce: Callable[[str, int], None],
        config: PromoterConfig,
    ) -> None:
        self.engine = engine
        self.repo = repository
        self.announce = announce
        self.config = config
        self.since: datetime | None = None

    @property
    def interval_seconds(self) -> float:
        """Seconds between runs."""
        return self.config.interval_seconds

    async def run_once(self) -> dict[str, int]:
        """Announces the queues with jobs that came due since the last run; answers the counts."""
        async with self.engine.connect() as conn:
            due, checked_at = await self.repo.job_due_since(conn, since=self.since)
        self.since = checked_at
        for queue, count in due.items():
            self.announce(queue, count)
        return due

    async def run_until_drained(self) -> int:
        """One run (the watermark makes it complete); answers the jobs announced."""
        return sum((await self.run_once()).values())
