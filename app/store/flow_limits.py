"""FlowLimitStore: the statements of ``sql/flow_limits.sql`` (concurrency and rate limits)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from app.domain.records import FlowLimit, FlowLimitSet, FlowLimitUse
from app.store.conn import Conn


class FlowLimitStore:
    """Runs the statements that manage limits and their flow_state rows (the claim enforces them)."""

    async def flow_limit_list(self, conn: Conn) -> list[FlowLimitUse]:
        """Every limit, with how many jobs run under it now."""
        return [FlowLimitUse.from_row(row) for row in await conn.fetch("flow_limit_list")]

    async def flow_limit_held_back(self, conn: Conn, *, cap: int) -> dict[int, int]:
        """Per limit id, the pending jobs it holds back now (each key or queue counted up to ``cap``)."""
        rows = await conn.fetch("flow_limit_held_back", {"cap": cap})
        return {int(row["id"]): int(row["jobs"]) for row in rows}

    async def flow_limit_set(
        self,
        conn: Conn,
        *,
        scope: str,
        pattern: str,
        like_pattern: str,
        max_running: int | None,
        rate_limit: int | None,
        rate_per_seconds: float | None,
    ) -> FlowLimitSet:
        """Creates or replaces the limit of (scope, pattern); the row carries ``created``."""
        [row] = await conn.fetch(
            "flow_limit_set",
            {
                "scope": scope,
                "pattern": pattern,
                "like_pattern": like_pattern,
                "max_running": max_running,
                "rate_limit": rate_limit,
                "rate_per_seconds": rate_per_seconds,
            },
        )
        return FlowLimitSet.from_row(row)

    async def flow_limit_delete(self, conn: Conn, *, limit_id: int) -> FlowLimit | None:
        """Deletes one limit; the deleted row, or ``None`` if unknown."""
        rows = await conn.fetch("flow_limit_delete", {"id": limit_id})
        return FlowLimit.from_row(rows[0]) if rows else None

    async def flow_state_prune(
        self,
        conn: Conn,
        *,
        batch_size: int,
        idle_seconds: float,
        now: datetime | None = None,
    ) -> int:
        """Deletes at most ``batch_size`` idle flow_state rows; answers how many."""
        rows = await conn.fetch(
            "flow_state_prune",
            {"batch_size": batch_size, "idle_seconds": idle_seconds, "now": now},
        )
        return len(rows)

    async def flow_released_fold(self, conn: Conn, *, batch_size: int) -> int:
        """Folds the given-back slots of at most ``batch_size`` keys no claim holds into their
        rows; answers how many keys."""
        rows = await conn.fetch("flow_released_fold", {"batch_size": batch_size})
        return len(rows)

    async def flow_state_lock(self, conn: Conn, *, keys: Sequence[str]) -> None:
        """Locks these flow_state rows in key order, waiting for their holders (in the caller's
        transaction: the claim that follows takes their jobs)."""
        await conn.fetch("flow_state_lock", {"keys": list(keys)})

    async def flow_state_create(self, conn: Conn, *, keys: Sequence[str]) -> None:
        """Creates the flow_state rows a claim found missing (idle: nothing running, full buckets)."""
        await conn.fetch("flow_state_create", {"keys": list(keys)})
