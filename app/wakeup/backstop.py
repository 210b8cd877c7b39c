"""The long-poll backstop: once a second, wake parked claims whose queues have due jobs.

Wake-ups can be lost (a dropped LISTEN connection, a commit between two instances' windows).
Rather than every parked claim re-running the claim statement each second (200 parked claims
would be 200 claims a second of pure overhead), the instance asks once, for all queues that have
waiters, which of them hold due jobs, and wakes about as many waiters there as jobs are due.
The runner (app/maintenance/runner.py) ticks it on every instance and supervises it.
"""

from __future__ import annotations

from app.queue.services import Services
from app.queue.waiters import WaiterHub
from app.settings import setting_default

BACKSTOP_INTERVAL_DEFAULT: float = setting_default("longpoll_backstop_seconds")
BACKSTOP_CAP = 100


class Backstop:
    """Checks the queues of parked claims for due jobs every interval and wakes their waiters."""

    name = "backstop"
    leader_only = False
    batch_size = None

    def __init__(
        self,
        *,
        services: Services,
        hub: WaiterHub,
        interval_seconds: float = BACKSTOP_INTERVAL_DEFAULT,
    ) -> None:
        if not interval_seconds > 0:
            raise ValueError("interval_seconds must be > 0")
        self.services = services
        self.hub = hub
        self.interval_seconds = interval_seconds

    async def run_once(self) -> int:
        """One check; answers how many waiters it woke."""
        queues = self.hub.waiting_queues()
        if not queues:
            return 0
        due = await self.services.upkeep.due_in_queues(queues, cap=BACKSTOP_CAP)
        return sum(self.hub.notify(queue, count) for queue, count in due.items() if count)

    async def run_batch(self) -> int:
        """One check (the runner's unit of work)."""
        return await self.run_once()
