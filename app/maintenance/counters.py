"""The counter fold: empties the counter journals' old slot into their sums (migrations 0022, 0028).

The triggers on ``jobs`` append one row per (queue, state) a statement moved to ``queue_counts``
and one per (queue, minute, outcome) to ``queue_throughput``, instead of updating a shared row
(which made concurrent statements of a queue wait on each other's commit). Readers sum the rows,
so the counts are exact at any moment; this loop only bounds how many rows they sum. The rows
go to one of two journal slots (partitions); each pass turns the triggers over to the other
slot, then adds the one left behind into the sums and empties it with ``TRUNCATE``, so no row
is ever deleted and the journal leaves no dead tuple for vacuum.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.queue.services import Services

# Every two seconds: at 10,000 moving statements a second a slot holds some 40,000 rows when it
# is folded, which the per-queue reads (GET /v1/queues, the gauges) still sum in milliseconds.
COUNTER_FOLD_INTERVAL_DEFAULT = 2.0
# How long a fold waits for the transactions that appended to the old slot before the turn:
# readers of the whole journal (and late appenders to that slot) queue behind the waiting lock,
# so it stays short; a fold that gives up is retried on the next pass.
COUNTER_FOLD_LOCK_TIMEOUT_MS_DEFAULT = 200


@dataclass(frozen=True)
class CounterFoldConfig:
    """How often the journals are folded and how long a fold waits for the old slot's lock."""

    interval_seconds: float = COUNTER_FOLD_INTERVAL_DEFAULT
    lock_timeout_ms: int = COUNTER_FOLD_LOCK_TIMEOUT_MS_DEFAULT

    def __post_init__(self) -> None:
        if not 0 < self.interval_seconds <= 60:
            raise ValueError("interval_seconds must be within (0, 60]")
        if not 1 <= self.lock_timeout_ms <= 10_000:
            raise ValueError("lock_timeout_ms must be within 1..10000")


class CounterFold:
    """Turns the counter journals to their other slot and folds the old one, once a tick."""

    name = "counters"
    # Two instances folding at once stay correct (each slot is folded under one lock), but one
    # is enough.
    leader_only = True
    # A fold empties a whole slot, whatever it holds: one call a tick.
    batch_size = None

    def __init__(self, *, services: Services, config: CounterFoldConfig) -> None:
        self.services = services
        self.config = config

    @property
    def interval_seconds(self) -> float:
        """Seconds between folds."""
        return self.config.interval_seconds

    async def run_once(self) -> int:
        """Folds once; answers the rows folded (the larger journal's), 0 when the old slot was
        still held by its appenders (the next pass tries again)."""
        folded = await self.services.upkeep.fold_counters(
            lock_timeout_ms=self.config.lock_timeout_ms
        )
        return folded or 0

    async def run_batch(self) -> int:
        """One fold, for the runner."""
        return await self.run_once()
