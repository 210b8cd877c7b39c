"""The result backstop: once per backstop interval, wake parked job reads whose job finished or is gone.

A finished job's notification is lost when the control connection is down as it is sent.
Every waiter is woken once the connection is back, but a connection that died without a word
(a network cut) is only noticed at its next keep-alive, seconds later. Rather than each parked
read re-reading its job every few seconds (500 parked reads would be 100 reads a second of pure overhead), the instance asks
once, for every job it has waiters on, which of them are finished or gone, and wakes those
waiters; they re-read their job and answer. One statement per interval (in chunks of
``RESULT_BACKSTOP_CHUNK`` ids), none while nobody waits. A lost notification therefore costs a
waiter at most one interval (``JOBQ_LONGPOLL_BACKSTOP_SECONDS``, 1 s), never its whole wait.
The runner (app/maintenance/runner.py) ticks it on every instance and supervises it.
"""

from __future__ import annotations

from app.queue.results import ResultHub
from app.queue.services import Services
from app.settings import setting_default

RESULT_BACKSTOP_INTERVAL_DEFAULT: float = setting_default("longpoll_backstop_seconds")
RESULT_BACKSTOP_CHUNK = 1000


class ResultBackstop:
    """Checks the jobs of parked reads every interval and wakes the waiters of those that finished."""

    name = "result_backstop"
    leader_only = False
    batch_size = None

    def __init__(
        self,
        *,
        services: Services,
        interval_seconds: float = RESULT_BACKSTOP_INTERVAL_DEFAULT,
    ) -> None:
        if not interval_seconds > 0:
            raise ValueError("interval_seconds must be > 0")
        self.services = services
        # The parked reads of this instance.
        self.results: ResultHub = services.results.hub
        self.interval_seconds = interval_seconds

    async def run_once(self) -> int:
        """One check; answers how many waiters it woke."""
        waiting = self.results.waiting_jobs()
        woken = 0
        for start in range(0, len(waiting), RESULT_BACKSTOP_CHUNK):
            chunk = waiting[start : start + RESULT_BACKSTOP_CHUNK]
            for job_id in await self.services.results.settled(chunk):
                woken += self.results.notify(job_id)
        return woken

    async def run_batch(self) -> int:
        """One check (the runner's unit of work)."""
        return await self.run_once()
