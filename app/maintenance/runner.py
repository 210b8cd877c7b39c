"""The shared runner: ticks every background loop, supervises it, and says when one has stalled.

Some loops run on every instance (the promoter, the long-poll backstop); the others only while
this instance is the elected leader (the reaper, the pruner). Leadership is a session-level
advisory lock held by the control connection: if this process dies, PostgreSQL ends the session
and frees the lock, and the next instance to ask takes it within about one election interval.
The loops stay correct if two instances run them at once.

A loop can fail in any way (a pool timeout, a bug): the runner logs the traceback, backs off and
carries on, so no failure ends a loop for good. A loop that has not finished a batch for a few
intervals is *stalled*; ``/readyz`` then fails, so an orchestrator replaces the instance rather
than letting it hold the leader lock while nobody reaps.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from app.errors import brief
from app.queue.services import Services
from app.settings import setting_default

logger = logging.getLogger("jobq.maintenance")

ELECTION_INTERVAL_DEFAULT: float = setting_default("election_interval_seconds")
STALL_INTERVALS_DEFAULT: float = setting_default("loop_stall_intervals")
STALL_MIN_SECONDS_DEFAULT: float = setting_default("loop_stall_min_seconds")
# A failing loop retries after interval x 2^failures, up to this: soon enough to notice a fix.
FAILURE_BACKOFF_MAX_SECONDS = 30.0


class Loop(Protocol):
    """What the runner needs of a loop: a name, a cadence, where it runs, and one bounded batch."""

    name: str

    @property
    def interval_seconds(self) -> float: ...

    @property
    def batch_size(self) -> int | None: ...  # None: one batch per tick

    @property
    def leader_only(self) -> bool: ...

    async def run_batch(self) -> int: ...


class BatchLoopConfig(Protocol):
    """What every batch loop's frozen config carries."""

    @property
    def interval_seconds(self) -> float: ...

    @property
    def batch_size(self) -> int: ...


ConfigT = TypeVar("ConfigT", bound=BatchLoopConfig)


class BatchLoop(Generic[ConfigT]):
    """Base of the loops that work in bounded batches through the services: cadence and size."""

    name: str
    leader_only: bool

    def __init__(self, *, services: Services, config: ConfigT) -> None:
        self.services = services
        self.config = config

    @property
    def interval_seconds(self) -> float:
        """Seconds between runs."""
        return self.config.interval_seconds

    @property
    def batch_size(self) -> int:
        """Rows one batch may handle."""
        return self.config.batch_size


class TickLoop:
    """Base of the loops that make one call through the services a tick, every interval."""

    name: str
    leader_only: bool
    batch_size = None  # one call per tick

    def __init__(self, *, services: Services, interval_seconds: float) -> None:
        if not interval_seconds > 0:
            raise ValueError("interval_seconds must be > 0")
        self.services = services
        self.interval_seconds = interval_seconds


@dataclass
class LoopHealth:
    """When a loop last finished a batch, and how it has been failing since."""

    name: str
    stall_after: float
    active: bool = False
    last_progress: float = 0.0
    failures: int = 0
    last_error: str | None = None
    task: asyncio.Task[None] | None = field(default=None, repr=False)

    def stalled(self, now: float) -> bool:
        """Whether the loop should be running here but has not finished a batch in time."""
        if self.task is not None and self.task.done():
            return True
        return self.active and now - self.last_progress > self.stall_after


async def drain(loop: Loop, *, on_batch: Callable[[], None] = lambda: None) -> int:
    """Runs the loop's batches until one comes back short; answers the rows handled in all."""
    handled = 0
    while True:
        batch = await loop.run_batch()
        on_batch()
        handled += batch
        if loop.batch_size is None or batch < loop.batch_size:
            return handled


class LoopRunner:
    """Runs and supervises the loops; leader-only loops only while ``lead()`` says so."""

    def __init__(
        self,
        *,
        lead: Callable[[], Awaitable[bool]],
        loops: list[Loop],
        election_interval: float = ELECTION_INTERVAL_DEFAULT,
        stall_intervals: float = STALL_INTERVALS_DEFAULT,
        stall_min_seconds: float = STALL_MIN_SECONDS_DEFAULT,
    ) -> None:
        if not stall_intervals >= 1 or not stall_min_seconds > 0:
            raise ValueError("stall_intervals must be >= 1 and stall_min_seconds > 0")
        self.lead = lead
        self.loops = loops
        self.election_interval = election_interval
        self.health = {
            loop.name: LoopHealth(
                loop.name, max(stall_intervals * loop.interval_seconds, stall_min_seconds)
            )
            for loop in loops
        }
        self._leader = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def is_leader(self) -> bool:
        """Whether this instance runs the leader-only loops now."""
        return self._leader.is_set()

    def start(self) -> None:
        """Starts the election (when any loop needs it) and one named task per loop."""
        if any(loop.leader_only for loop in self.loops):
            self._tasks.append(asyncio.create_task(self._elect_forever(), name="jobq-election"))
        for loop in self.loops:
            task = asyncio.create_task(self._tick_forever(loop), name=f"jobq-{loop.name}")
            self.health[loop.name].task = task
            self._tasks.append(task)

    async def stop(self) -> None:
        """Cancels the election and the loops and waits for them."""
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        self._leader.clear()
        for health in self.health.values():
            health.task = None
            health.active = False

    def stalled(self) -> list[str]:
        """The loops that should run here and have not finished a batch in time."""
        now = asyncio.get_running_loop().time()
        return [name for name, health in self.health.items() if health.stalled(now)]

    async def _elect_forever(self) -> None:
        while True:
            try:
                leader = await self.lead()
            # A supervisor: no error may end the election (it is logged with its traceback).
            except Exception as exc:
                logger.error("leader election failed: %s", brief(exc), exc_info=exc)
                leader = False
            if leader:
                self._leader.set()
            else:
                self._leader.clear()
            await asyncio.sleep(self.election_interval * random.uniform(0.8, 1.2))

    async def _tick_forever(self, loop: Loop) -> None:
        health = self.health[loop.name]
        clock = asyncio.get_running_loop().time

        def progressed() -> None:
            health.last_progress = clock()

        while True:
            if loop.leader_only and not self._leader.is_set():
                health.active = False
                await self._leader.wait()
            if not health.active:
                # Just started or just elected: the stall clock starts now.
                health.active = True
                progressed()
            try:
                moved = await drain(loop, on_batch=progressed)
            # A supervisor: a pool timeout or a bug must not end the loop; log, back off, go on.
            except Exception as exc:
                health.failures += 1
                health.last_error = brief(exc)
                delay = min(
                    loop.interval_seconds * 2 ** min(health.failures, 20),
                    FAILURE_BACKOFF_MAX_SECONDS,
                )
                logger.error(
                    "%s failed (%d in a row), retrying in %.1fs: %s",
                    loop.name,
                    health.failures,
                    delay,
                    health.last_error,
                    exc_info=exc,
                )
            else:
                if health.failures:
                    logger.info("%s recovered after %d failures", loop.name, health.failures)
                health.failures = 0
                health.last_error = None
                if moved:
                    logger.debug("%s handled %d rows", loop.name, moved)
                delay = loop.interval_seconds * random.uniform(0.9, 1.1)
            await asyncio.sleep(delay)
