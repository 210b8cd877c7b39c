"""The promoter: scheduled jobs (delayed, retrying after a backoff) become pending as they come due."""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime

from app.maintenance.runner import BatchLoop
from app.settings import setting_default

PROMOTER_INTERVAL_DEFAULT: float = setting_default("promoter_interval_seconds")
PROMOTER_BATCH_SIZE_DEFAULT: int = setting_default("promoter_batch_size")
# Once a second, the keys whose rows an enqueue touched in the last ten seconds are looked at for
# a waiting job with nothing open ahead of it (app/store/sql/workflows.sql, ordering_key_unstick):
# the race it catches up lasts milliseconds, so each key is looked at about ten times.
ORDERING_SWEEP_EVERY_SECONDS = 1.0
ORDERING_KEYS_RECENT_SECONDS = 10.0


@dataclass(frozen=True)
class PromoterConfig:
    """How often the promoter looks for scheduled jobs that came due, and how many one batch moves."""

    interval_seconds: float = PROMOTER_INTERVAL_DEFAULT
    batch_size: int = PROMOTER_BATCH_SIZE_DEFAULT

    def __post_init__(self) -> None:
        if not 0 < self.interval_seconds <= 10:
            raise ValueError("interval_seconds must be within (0, 10]")
        if not 1 <= self.batch_size <= 10_000:
            raise ValueError("batch_size must be within 1..10000")


class Promoter(BatchLoop[PromoterConfig]):
    """Moves due scheduled jobs to pending in bounded batches and announces their queues.

    Jobs waiting for their time are kept out of the claim index (state ``scheduled``), so they
    cost a claim nothing; this loop moves them in as they come due, through
    ``ix_jobs_scheduled_run_at``. It runs on every instance, not only the leader, so a leader
    change does not delay due jobs; two instances promoting at once skip each other's rows.
    A job is claimable within about one interval of its ``run_at``.
    """

    name = "promoter"
    leader_only = False
    _swept_at = float("-inf")  # when this instance last swept the ordering keys (monotonic)

    async def run_once(self, *, now: datetime | None = None) -> int:
        """Promotes one batch of jobs due by ``now`` (default the database's now()), and catches
        up ordering keys left with a waiting job and nothing open."""
        promoted = await self.services.upkeep.promote(batch_size=self.config.batch_size, now=now)
        clock = time.monotonic()
        if clock - self._swept_at < ORDERING_SWEEP_EVERY_SECONDS:
            return promoted
        self._swept_at = clock
        caught_up = await self.services.workflows.unstick_ordering_keys(
            recent_seconds=ORDERING_KEYS_RECENT_SECONDS
        )
        return promoted + caught_up

    async def run_batch(self) -> int:
        """One batch; answers the jobs promoted."""
        return await self.run_once()
