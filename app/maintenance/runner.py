"""The shared runner: while this instance is the elected leader, ticks every maintenance loop."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Awaitable, Callable
from typing import Generic, Protocol, TypeVar

from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine

from app.errors import brief
from app.queue.repository import Repository

logger = logging.getLogger("jobq.maintenance")

ELECTION_INTERVAL_DEFAULT = 1.0


async def run_batches(run_batch: Callable[[], Awaitable[int]], *, batch_size: int) -> int:
    """Runs bounded batches until one comes back short; answers the rows they handled in all."""
    handled = 0
    while True:
        batch = await run_batch()
        handled += batch
        if batch < batch_size:
            return handled


class BatchLoopConfig(Protocol):
    """What every batch loop's frozen config carries."""

    @property
    def interval_seconds(self) -> float: ...

    @property
    def batch_size(self) -> int: ...


ConfigT = TypeVar("ConfigT", bound=BatchLoopConfig)


class BatchLoop(Generic[ConfigT]):
    """Base of the loops that work in bounded batches on the pool: engine, repository, config."""

    name: str

    def __init__(self, *, engine: AsyncEngine, repository: Repository, config: ConfigT) -> None:
        self.engine = engine
        self.repo = repository
        self.config = config

    @property
    def interval_seconds(self) -> float:
        """Seconds between runs."""
        return self.config.interval_seconds

    async def run_batch(self) -> int:
        """One bounded batch in its own transaction; answers the rows it handled."""
        raise NotImplementedError

    async def run_until_drained(self) -> int:
        """Runs batches until one comes back short; answers the rows handled in all."""
        return await run_batches(self.run_batch, batch_size=self.config.batch_size)


class MaintenanceLoop(Protocol):
    """What the runner needs of a loop: a name, an interval and one unit of work."""

    name: str

    @property
    def interval_seconds(self) -> float: ...

    async def run_until_drained(self) -> int: ...


class MaintenanceRunner:
    """Runs the loops while ``lead()`` says this instance is the leader; logs and carries on on errors.

    Leadership is a session-level advisory lock held by the control connection: if this process
    dies, PostgreSQL ends the session and frees the lock, and the next instance to ask takes it
    within about one election interval. The loops stay correct if two instances run them at once.
    """

    def __init__(
        self,
        *,
        lead: Callable[[], Awaitable[bool]],
        loops: list[MaintenanceLoop],
        election_interval: float = ELECTION_INTERVAL_DEFAULT,
    ) -> None:
        self.lead = lead
        self.loops = loops
        self.election_interval = election_interval
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
        """Cancels the election and the loops and waits for them."""
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        self._leader.clear()

    async def _elect_forever(self) -> None:
        while True:
            if await self.lead():
                self._leader.set()
            else:
                self._leader.clear()
            await asyncio.sleep(self.election_interval * random.uniform(0.8, 1.2))

    async def _tick_forever(self, loop: MaintenanceLoop) -> None:
        while True:
            await self._leader.wait()
            try:
                moved = await loop.run_until_drained()
                if moved:
                    logger.debug("%s moved %d jobs", loop.name, moved)
            except (DBAPIError, OSError) as exc:
                logger.warning("%s failed: %s", loop.name, brief(exc))
            await asyncio.sleep(loop.interval_seconds * random.uniform(0.9, 1.1))
