"""MaintenanceStore: the statements of ``sql/maintenance.sql``, the loops' batches and the jobs
they set aside."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from app.domain.maintenance_records import SetAside
from app.domain.records import ReapedJob
from app.domain.types import BackoffPolicy, Retention
from app.store.conn import Conn


class MaintenanceStore:
    """Reaps, promotes and prunes in bounded batches (or one job at a time, when a batch
    failed), and records, lists, counts and puts back the jobs a loop set aside."""

    def __init__(self, *, backoff: BackoffPolicy) -> None:
        self.backoff = backoff

    def _reap_params(self, now: datetime | None) -> dict[str, Any]:
        return {
            "now": now,
            "backoff_base": self.backoff.base_seconds,
            "backoff_cap": self.backoff.cap_seconds,
            "errors_kept": self.backoff.errors_kept,
        }

    async def job_reap(
        self, conn: Conn, *, batch_size: int, now: datetime | None = None
    ) -> list[ReapedJob]:
        """Returns at most ``batch_size`` expired leases to scheduled (or dead); answers the rows moved."""
        params = {"batch_size": batch_size, **self._reap_params(now)}
        return [ReapedJob.from_row(row) for row in await conn.fetch("job_reap", params)]

    async def job_reap_one(
        self, conn: Conn, *, job_id: int, now: datetime | None = None
    ) -> list[ReapedJob]:
        """As :meth:`job_reap` for the one job ``job_id`` (if its lease expired)."""
        params = {"id": job_id, **self._reap_params(now)}
        return [ReapedJob.from_row(row) for row in await conn.fetch("job_reap_one", params)]

    async def job_reap_candidates(
        self, conn: Conn, *, batch_size: int, now: datetime | None = None
    ) -> list[tuple[int, str]]:
        """The (id, queue) of the jobs :meth:`job_reap` would take now."""
        rows = await conn.fetch("job_reap_candidates", {"batch_size": batch_size, "now": now})
        return [(row["id"], row["queue"]) for row in rows]

    async def job_promote(
        self, conn: Conn, *, batch_size: int, now: datetime | None = None
    ) -> Counter[str]:
        """Moves at most ``batch_size`` due scheduled jobs to pending; answers how many per queue."""
        rows = await conn.fetch("job_promote", {"batch_size": batch_size, "now": now})
        return Counter(row["queue"] for row in rows)

    async def job_promote_one(
        self, conn: Conn, *, job_id: int, now: datetime | None = None
    ) -> Counter[str]:
        """As :meth:`job_promote` for the one job ``job_id`` (if it is due)."""
        rows = await conn.fetch("job_promote_one", {"id": job_id, "now": now})
        return Counter(row["queue"] for row in rows)

    async def job_promote_candidates(
        self, conn: Conn, *, batch_size: int, now: datetime | None = None
    ) -> list[tuple[int, str]]:
        """The (id, queue) of the jobs :meth:`job_promote` would take now."""
        rows = await conn.fetch("job_promote_candidates", {"batch_size": batch_size, "now": now})
        return [(row["id"], row["queue"]) for row in rows]

    async def job_prune(
        self,
        conn: Conn,
        *,
        batch_size: int,
        succeeded_seconds: float,
        cancelled_seconds: float,
        dead_seconds: float,
        now: datetime | None = None,
    ) -> int:
        """Deletes at most ``batch_size`` finished jobs past retention; answers how many."""
        params = {
            "batch_size": batch_size,
            "now": now,
            "succeeded_seconds": succeeded_seconds,
            "cancelled_seconds": cancelled_seconds,
            "dead_seconds": dead_seconds,
        }
        return len(await conn.fetch("job_prune", params))

    async def job_prune_one(
        self, conn: Conn, *, job_id: int, retention: Retention, now: datetime | None = None
    ) -> int:
        """As :meth:`job_prune` for the one job ``job_id`` (if its retention passed)."""
        params = {"id": job_id, "now": now, **retention.params()}
        return len(await conn.fetch("job_prune_one", params))

    async def job_prune_candidates(
        self, conn: Conn, *, batch_size: int, retention: Retention, now: datetime | None = None
    ) -> list[tuple[int, str]]:
        """The (id, queue) of the jobs :meth:`job_prune` would delete now."""
        params = {"batch_size": batch_size, "now": now, **retention.params()}
        rows = await conn.fetch("job_prune_candidates", params)
        return [(row["id"], row["queue"]) for row in rows]

    async def set_aside_record(
        self, conn: Conn, *, loop: str, job_id: int, queue: str | None, error: str, sqlstate: str
    ) -> None:
        """Records that ``loop`` could not move ``job_id`` even alone (counted again if it was)."""
        await conn.fetch(
            "set_aside_record",
            {
                "loop": loop,
                "job_id": job_id,
                "queue": queue,
                "error": error,
                "sqlstate": sqlstate,
            },
        )

    async def set_aside_list(
        self, conn: Conn, *, limit: int, queue_patterns: Sequence[str] | None
    ) -> list[SetAside]:
        """The jobs set aside, newest failure first, with each job's state now."""
        rows = await conn.fetch(
            "set_aside_list",
            {
                "limit": limit,
                "queue_patterns": list(queue_patterns) if queue_patterns is not None else None,
            },
        )
        return [SetAside.from_row(row) for row in rows]

    async def set_aside_of_job(self, conn: Conn, *, job_id: int) -> list[SetAside]:
        """The loops that set job ``job_id`` aside."""
        return [SetAside.from_row(r) for r in await conn.fetch("set_aside_of_job", {"id": job_id})]

    async def set_aside_counts(self, conn: Conn) -> dict[tuple[str, str], int]:
        """How many jobs each loop has set aside now, by (loop, queue)."""
        rows = await conn.fetch("set_aside_counts")
        return {(row["loop"], row["queue"]): int(row["jobs"]) for row in rows}

    async def set_aside_put_back(
        self, conn: Conn, *, loop: str, job_id: int, actor: str, actor_key_id: int | None
    ) -> SetAside | None:
        """Puts ``job_id`` back into ``loop``'s batches (audited); ``None`` when it was not set
        aside by that loop."""
        rows = await conn.fetch(
            "set_aside_put_back",
            {"loop": loop, "job_id": job_id, "actor": actor, "actor_key_id": actor_key_id},
        )
        return SetAside.from_row(rows[0]) if rows else None

    async def set_aside_prune(self, conn: Conn, *, batch_size: int) -> int:
        """Deletes at most ``batch_size`` rows whose job is gone or left the loop's state."""
        return len(await conn.fetch("set_aside_prune", {"batch_size": batch_size}))
