"""The long-poll backstop: once a second, wake parked claims whose queues have due jobs.

Wake-ups can be lost (a dropped LISTEN connection, a promoter between leaders, a commit that
raced the promoter's window). Rather than every parked claim re-running the claim statement
each second (200 parked claims would be 200 claims a second of pure overhead), the instance
asks once, for all queues that have waiters, which of them hold due jobs, and wakes about as
many waiters there as jobs are due.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random

from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine

from app.errors import brief
from app.queue.repository import Repository
from app.wakeup.hub import WaiterHub

logger = logging.getLogger("jobq.wakeup")

BACKSTOP_INTERVAL_DEFAULT = 1.0
BACKSTOP_CAP = 100


class Backstop:
    """Checks the queues of parked claims for due jobs every interval and wakes their waiters."""

    name = "backstop"

    def __init__(
        self,
        *,
        engine: AsyncEngine,
        repository: Repository,
        hub: WaiterHub,
        interval_seconds: float = BACKSTOP_INTERVAL_DEFAULT,
    ) -> None:
        if not interval_seconds > 0:
            raise ValueError("interval_seconds must be > 0")
        self.engine = engine
        self.repo = repository
        self.hub = hub
        self.interval_seconds = interval_seconds
        self._task: asyncio.Task[None] | None = None

    async def run_once(self) -> int:
        """One check; answers how many waiters it woke."""
        queues = self.hub.waiting_queues()
        if not queues:
            return 0
        async with self.engine.connect() as conn:
            due = await self.repo.job_due_in_queues(conn, queues=queues, cap=BACKSTOP_CAP)
        return sum(self.hub.notify(queue, count) for queue, count in due.items() if count)

    def start(self) -> None:
        """Starts the named, supervised task that runs the check every interval."""
        self._task = asyncio.create_task(self._run_forever(), name="jobq-backstop")

    async def stop(self) -> None:
        """Stops the task."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run_forever(self) -> None:
        while True:
            await asyncio.sleep(self.interval_seconds * random.uniform(0.8, 1.0))
            try:
                woken = await self.run_once()
                if woken:
                    logger.debug("backstop woke %d waiters", woken)
            except (DBAPIError, OSError) as exc:
                logger.warning("backstop check failed: %s", brief(exc))
