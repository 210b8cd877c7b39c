"""WorkerStore: the statements of ``sql/workers.sql``, the registry of workers seen claiming."""

from __future__ import annotations

from collections.abc import Sequence

from app.domain.records import WorkerSeen
from app.store.conn import Conn, to_json


class WorkerStore:
    """Writes the sightings each instance collects, and reads who works on what."""

    def __init__(self, *, instance: str | None = None) -> None:
        # This jobq instance's name, written with the sightings it saw.
        self.instance = instance

    async def worker_seen(
        self, conn: Conn, *, sightings: Sequence[tuple[str, int | None, Sequence[str]]]
    ) -> None:
        """Records (worker id, key id, queues) sightings at now()."""
        rows = [
            {"worker_id": w, "key_id": k or 0, "queues": list(q), "instance": self.instance}
            for w, k, q in sightings
        ]
        await conn.fetch("worker_seen", {"sightings": to_json(rows)})

    async def worker_prune(self, conn: Conn, *, idle_seconds: float, batch_size: int) -> int:
        """Deletes at most ``batch_size`` workers unseen for ``idle_seconds``; answers how many."""
        rows = await conn.fetch(
            "worker_prune", {"idle_seconds": idle_seconds, "batch_size": batch_size}
        )
        return len(rows)

    async def worker_overview(
        self,
        conn: Conn,
        *,
        shown_seconds: float,
        live_seconds: float,
        queue_patterns: Sequence[str] | None = None,
    ) -> list[WorkerSeen]:
        """Workers seen lately and lease holders, busy ones first."""
        rows = await conn.fetch(
            "worker_overview",
            {
                "shown_seconds": shown_seconds,
                "live_seconds": live_seconds,
                "queue_patterns": list(queue_patterns) if queue_patterns is not None else None,
            },
        )
        return [WorkerSeen.from_row(row) for row in rows]

    async def worker_live_per_queue(
        self, conn: Conn, *, queues: Sequence[str], live_seconds: float
    ) -> dict[str, int]:
        """Per queue, the workers seen polling it in the last ``live_seconds``."""
        rows = await conn.fetch(
            "worker_live_per_queue", {"queues": list(queues), "live_seconds": live_seconds}
        )
        return {row["queue"]: int(row["live_workers"]) for row in rows}
