"""ControlStore: the statements of ``sql/control.sql`` (wake-ups, the leader lock, health, the
planner's statistics of ``jobs``)."""

from __future__ import annotations

from collections.abc import Sequence

from app.store.conn import Conn

# Maintenance leader lock key: "jobq" in ASCII, so it is recognisable in pg_locks.
MAINTENANCE_LOCK_KEY = 0x6A6F6271


class ControlStore:
    """Runs the statements of the control connection and the health check."""

    async def wakeup_notify(self, conn: Conn, *, channel: str, payloads: Sequence[str]) -> None:
        """Sends the wake-up notifications (one per payload), on the control connection's driver."""
        if payloads:
            await conn.fetch("wakeup_notify", {"channel": channel, "payloads": list(payloads)})

    async def maintenance_try_lead(self, conn: Conn) -> bool:
        """Takes the maintenance leader lock on this connection's session, if free."""
        [row] = await conn.fetch("maintenance_try_lead", {"lock_key": MAINTENANCE_LOCK_KEY})
        return bool(row["acquired"])

    async def health_ping(self, conn: Conn) -> None:
        """Fails if the database does not answer."""
        await conn.fetch("health_ping")

    async def jobs_analyze_due(self, conn: Conn) -> bool:
        """Whether ``jobs`` needs an ANALYZE that autovacuum will not run."""
        rows = await conn.fetch("jobs_analyze_due")
        return bool(rows and rows[0]["due"])

    async def jobs_analyze(self, conn: Conn) -> None:
        """Refreshes the planner's statistics of ``jobs``."""
        await conn.fetch("jobs_analyze")
