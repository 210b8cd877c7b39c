"""Who works on what: the workers seen claiming, live or idle, and what holds a job back.

A claim tells this service who asked for which queues (:meth:`WorkerService.seen`, a dictionary
write: the claim path writes nothing to the database). Every few seconds the sightings loop
(``app/maintenance/sightings.py``) writes them to ``workers`` in one statement, at the
database's now(). A worker is *live* while it was seen claiming (a long-poll included: a
worker re-claims at least every 20 s) or heartbeating a job it holds within
``WORKER_LIVE_SECONDS``.
"""

from __future__ import annotations

from collections.abc import Sequence

from app.domain.records import WorkerSeen
from app.domain.types import WORKER_LIVE_SECONDS
from app.store import Stores
from app.store.unit import UnitOfWork

# GET /v1/workers lists the workers seen in this window (and every lease holder).
WORKERS_SHOWN_SECONDS = 600.0
# A worker unseen this long is deleted from the registry.
WORKERS_KEPT_SECONDS = 86_400.0
PRUNE_BATCH = 1000


class WorkerService:
    """Collects sightings in memory, writes them, and lists workers with what they hold."""

    def __init__(self, *, unit: UnitOfWork, stores: Stores) -> None:
        self.unit = unit
        self.stores = stores
        self._sightings: dict[tuple[str, int | None], tuple[str, ...]] = {}

    def seen(self, worker_id: str, key_id: int | None, queues: Sequence[str]) -> None:
        """Notes that a worker claimed from ``queues`` (written by the next :meth:`flush`)."""
        self._sightings[(worker_id, key_id)] = tuple(queues)

    async def flush(self) -> int:
        """Writes the sightings noted since the last flush, and deletes long-unseen workers;
        answers how many sightings it wrote."""
        sightings = dict(self._sightings)
        if sightings:
            rows = [(w, k, q) for (w, k), q in sightings.items()]
            async for attempt in self.unit.ops():
                async with attempt as conn:
                    await self.stores.workers.worker_seen(conn, sightings=rows)
            # Forgotten only once written (a failed write leaves them for the next flush), and
            # only those not seen again meanwhile.
            for key, queues in sightings.items():
                if self._sightings.get(key) == queues:
                    del self._sightings[key]
        async for attempt in self.unit.ops():
            async with attempt as conn:
                await self.stores.workers.worker_prune(
                    conn, idle_seconds=WORKERS_KEPT_SECONDS, batch_size=PRUNE_BATCH
                )
        return len(sightings)

    async def overview(self, *, queue_patterns: Sequence[str] | None = None) -> list[WorkerSeen]:
        """Workers seen in the last ten minutes and every lease holder, busy ones first."""
        async for attempt in self.unit.ops():
            async with attempt as conn:
                rows = await self.stores.workers.worker_overview(
                    conn,
                    shown_seconds=WORKERS_SHOWN_SECONDS,
                    live_seconds=WORKER_LIVE_SECONDS,
                    queue_patterns=queue_patterns,
                )
        return rows

    async def live_per_queue(self, queues: Sequence[str]) -> dict[str, int]:
        """Per queue, how many live workers poll it."""
        if not queues:
            return {}
        async for attempt in self.unit.ops():
            async with attempt as conn:
                counts = await self.stores.workers.worker_live_per_queue(
                    conn, queues=queues, live_seconds=WORKER_LIVE_SECONDS
                )
        return counts
