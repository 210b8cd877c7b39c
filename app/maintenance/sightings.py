"""The sightings loop: every few seconds, write the workers this instance saw claiming.

Each instance notes who claimed from which queues in memory (``services.workers.seen``) and
this loop writes them to ``workers`` in one statement, at the database's now(), then deletes
workers unseen for a day. It runs on every instance: each writes what it saw.
"""

from __future__ import annotations

from app.maintenance.runner import TickLoop
from app.queue.services import Services

# Often enough that a worker seen once is live within seconds, rarely enough to cost nothing.
SIGHTINGS_INTERVAL_SECONDS = 5.0


class WorkerSightings(TickLoop):
    """Writes this instance's worker sightings every interval."""

    name = "sightings"
    leader_only = False

    def __init__(
        self, *, services: Services, interval_seconds: float = SIGHTINGS_INTERVAL_SECONDS
    ) -> None:
        super().__init__(services=services, interval_seconds=interval_seconds)

    async def run_batch(self) -> int:
        """One write; answers how many sightings it wrote."""
        return await self.services.workers.flush()
