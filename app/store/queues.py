"""QueueStore: the statements of ``sql/queues.sql``, one method each."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from app.domain.records import (
    QueueDeleted,
    QueuePut,
    QueueStats,
    QueueSwitch,
    QueueThroughput,
    QueueWindowStats,
)
from app.domain.types import NOT_GIVEN, NotGiven
from app.store.conn import Conn


class QueueStore:
    """Runs the queues' statements: their switch, counters, per-minute outcomes and the
    figures of a window's finished jobs."""

    async def queue_set_paused(
        self,
        conn: Conn,
        *,
        name: str,
        paused: bool,
        actor: str,
        actor_key_id: int | None,
    ) -> QueueSwitch | None:
        """Pauses or resumes a known queue; ``None`` when no row and no job names it."""
        rows = await conn.fetch(
            "queue_set_paused",
            {"name": name, "paused": paused, "actor": actor, "actor_key_id": actor_key_id},
        )
        return QueueSwitch.from_row(rows[0]) if rows else None

    async def queue_put(
        self,
        conn: Conn,
        *,
        name: str,
        paused: bool | None,
        callback_url: str | NotGiven | None = NOT_GIVEN,
        actor: str,
        actor_key_id: int | None,
    ) -> QueuePut:
        """Creates a queue or sets its switch (``None`` keeps it) and its default callback
        (not given keeps it, ``None`` clears it); the row says if it was created."""
        [row] = await conn.fetch(
            "queue_put",
            {
                "name": name,
                "paused": paused,
                "set_callback": callback_url is not NOT_GIVEN,
                "callback_url": None if callback_url is NOT_GIVEN else callback_url,
                "actor": actor,
                "actor_key_id": actor_key_id,
            },
        )
        return QueuePut.from_row(row)

    async def queue_delete(
        self, conn: Conn, *, name: str, actor: str, actor_key_id: int | None
    ) -> QueueDeleted:
        """Deletes a queue that no job names; the row says if it was known, deleted, and its jobs."""
        [row] = await conn.fetch(
            "queue_delete", {"name": name, "actor": actor, "actor_key_id": actor_key_id}
        )
        return QueueDeleted.from_row(row)

    async def queue_stats(self, conn: Conn) -> list[QueueStats]:
        """Counts per queue and state, from the counters."""
        return [QueueStats.from_row(row) for row in await conn.fetch("queue_stats")]

    async def queue_throughput(self, conn: Conn, *, minutes: int) -> list[QueueThroughput]:
        """Outcomes per queue and minute over the last ``minutes`` minutes (current one included)."""
        rows = await conn.fetch("queue_throughput", {"minutes": minutes})
        return [QueueThroughput.from_row(row) for row in rows]

    async def queue_window_stats(
        self,
        conn: Conn,
        *,
        queue: str,
        windows: Sequence[float],
        scan: int,
        now: datetime | None = None,
    ) -> list[QueueWindowStats]:
        """One queue's finished jobs over each window (seconds back from ``now``), in order:
        outcomes, attempts, wait and run percentiles, from at most ``scan`` jobs of each state."""
        rows = await conn.fetch(
            "queue_window_stats",
            {"queue": queue, "windows": [float(w) for w in windows], "scan": scan, "now": now},
        )
        return [QueueWindowStats.from_row(row) for row in rows]

    async def counter_journal_turn(self, conn: Conn) -> int:
        """Turns the counter triggers over to the other journal slot; answers the one now current."""
        rows = await conn.fetch("counter_journal_turn", {})
        return int(rows[0]["slot"])

    async def counter_journal_fold(self, conn: Conn, *, lock_timeout_ms: int) -> int | None:
        """Folds the journal slot not current into the sums and truncates it; answers the rows
        folded, or None when its appenders did not finish within ``lock_timeout_ms``."""
        rows = await conn.fetch("counter_journal_fold", {"lock_timeout_ms": lock_timeout_ms})
        folded = rows[0]["folded"]
        return None if folded is None else int(folded)

    async def queue_throughput_prune(
        self,
        conn: Conn,
        *,
        keep_seconds: float,
        batch_size: int,
        now: datetime | None = None,
    ) -> int:
        """Deletes at most ``batch_size`` per-minute outcome sums older than ``keep_seconds``."""
        rows = await conn.fetch(
            "queue_throughput_prune",
            {"keep_seconds": keep_seconds, "batch_size": batch_size, "now": now},
        )
        return len(rows)
