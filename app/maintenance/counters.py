"""The counter fold: keeps the append-only counter journals short (migration 0022).

The triggers on ``jobs`` append one row per (queue, state) a statement moved to ``queue_counts``
and one per (queue, minute, outcome) to ``queue_throughput``, instead of updating a shared row
(which made concurrent statements of a queue wait on each other's commit). Readers sum the rows,
so the counts are exact at any moment; this loop only bounds how many rows they sum, replacing
a batch by its sums every couple of seconds.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.maintenance.runner import BatchLoop

# Every two seconds: at 10,000 moving statements a second the journal holds some 40,000 rows
# between folds, which the per-queue reads (GET /v1/queues, the gauges) still sum in milliseconds.
COUNTER_FOLD_INTERVAL_DEFAULT = 2.0
COUNTER_FOLD_BATCH_SIZE_DEFAULT = 50_000


@dataclass(frozen=True)
class CounterFoldConfig:
    """How often the journals are folded and how many rows one batch folds."""

    interval_seconds: float = COUNTER_FOLD_INTERVAL_DEFAULT
    batch_size: int = COUNTER_FOLD_BATCH_SIZE_DEFAULT

    def __post_init__(self) -> None:
        if not 0 < self.interval_seconds <= 60:
            raise ValueError("interval_seconds must be within (0, 60]")
        if not 1 <= self.batch_size <= 1_000_000:
            raise ValueError("batch_size must be within 1..1000000")


class CounterFold(BatchLoop[CounterFoldConfig]):
    """Folds a bounded batch of each counter journal into its sums, in one transaction."""

    name = "counters"
    # Two instances folding at once stay correct (each folds only rows the other has not), but
    # one is enough.
    leader_only = True

    async def run_once(self) -> int:
        """Folds one batch; answers the rows folded (the larger of the two journals')."""
        return await self.services.upkeep.fold_counters(batch_size=self.config.batch_size)

    async def run_batch(self) -> int:
        """One batch, for the runner."""
        return await self.run_once()
