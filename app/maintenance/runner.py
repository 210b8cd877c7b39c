"""The shared runner: elects one leader with a PostgreSQL advisory lock and ticks every loop on it."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from typing import Protocol

from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from app.queue.repository import Repository

logger = logging.getLogger("jobq.maintenance")

ELECTION_INTERVAL_DEFAULT = 1.0


class MaintenanceLoop(Protocol):
    """What the runner needs of a loop: a name, an interval and one unit of work."""

    name: str

    @property
    def interval_seconds(self) -> float: ...

    async def run_until_drained(self) -> int: ...


class MaintenanceRunner:
    """Runs the loops while this instance holds the leader lock; another instance takes over when it dies.

    The lock is session-level, on a connection of its own engine: if this process dies, PostgreSQL
    ends the session and frees the lock, and the next instance to try takes it within about one
    election interval. The loops are written to stay correct if two instances run them at once.
    """

    def __init__(
        self,
        *,
        lock_engine: AsyncEngine,
        repository: Repository,
        loops: list[MaintenanceLoop],
        election_interval: float = ELECTION_INTERVAL_DEFAULT,
    ) -> None:
        self.lock_engine = lock_engine
        self.repo = repository
        self.loops = loops
        self.election_interval = election_interval
        self._lock_conn: AsyncConnection | None = None
        self._leader = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def is_leader(self) -> bool:
        """Whether this instance runs the loops now."""
        return self._leader.is_set()

    def start(self) -> None:
        """Starts the election task and one task per loop, all named and owned by this runner."""
        self._tasks.append(asyncio.create_task(self._elect_forever(), name="jobq-election"))
        for loop in self.loops:
            self._tasks.append(
                asyncio.create_task(self._tick_forever(loop), name=f"jobq-{loop.name}")
            )

    async def stop(self) -> None:
        """Cancels the loops and gives the lock back."""
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        await self._drop_lock()

    async def _drop_lock(self) -> None:
        self._leader.clear()
        if self._lock_conn is not None:
            conn, self._lock_conn = self._lock_conn, None
            # Closing the session releases the advisory lock.
            with contextlib.suppress(DBAPIError, OSError):
                await conn.close()

    async def _elect_once(self) -> None:
        try:
            if self._lock_conn is None:
                self._lock_conn = await self.lock_engine.connect()
                self._lock_conn = await self._lock_conn.execution_options(
                    isolation_level="AUTOCOMMIT"
                )
            if self.is_leader:
                await self.repo.maintenance_ping(self._lock_conn)
            elif await self.repo.maintenance_try_lead(self._lock_conn):
                logger.info("this instance now runs maintenance")
                self._leader.set()
        except (DBAPIError, OSError) as exc:
            logger.warning("maintenance election failed: %s", exc)
            await self._drop_lock()

    async def _elect_forever(self) -> None:
        while True:
            await self._elect_once()
            await asyncio.sleep(self.election_interval * random.uniform(0.8, 1.2))

    async def _tick_forever(self, loop: MaintenanceLoop) -> None:
        while True:
            await self._leader.wait()
            try:
                moved = await loop.run_until_drained()
                if moved:
                    logger.info("%s moved %d jobs", loop.name, moved)
            except (DBAPIError, OSError) as exc:
                # Log and carry on: the next tick tries again.
                logger.warning("%s failed: %s", loop.name, exc)
            await asyncio.sleep(loop.interval_seconds * random.uniform(0.9, 1.1))
