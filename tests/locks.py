"""Observing PostgreSQL's row locks in tests: is any backend of this database waiting on one?"""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine


async def lock_waiters(engine: AsyncEngine) -> int:
    """How many backends of the engine's database are waiting for a lock now."""
    async with engine.connect() as conn:
        waiting = await conn.execute(
            text(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock'"
            )
        )
        return int(waiting.scalar_one())


async def someone_waits_on_a_lock(engine: AsyncEngine) -> bool:
    """Whether a backend of the engine's database is waiting for a lock now."""
    return await lock_waiters(engine) > 0
