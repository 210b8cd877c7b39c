"""In-process registry of parked job reads (``GET /v1/jobs/{id}?wait_seconds=``) per job id.

A read that waits for its job to finish parks here and holds no database connection. It is
woken by the job's finish, on whichever instance that happened: a row trigger on ``jobs``
(app/store/sql/schema/finished.sql) sends ``pg_notify('jobq_finished', <id>)`` when an
*awaited* job reaches ``succeeded``, ``dead`` or ``cancelled``, or is deleted, and the control
connection (app/wakeup/control.py) hands each payload to :meth:`ResultHub.notified`. A woken waiter
re-reads its job (one short statement) and parks again if it is still unfinished, so a wake-up
too many costs one read, never a wrong answer.

Wake-ups can be lost (the control connection down while the job finished); two things make
sure nobody sleeps through one: after every reconnect the channel wakes every waiter, and the
result backstop (app/wakeup/result_backstop.py) asks, once per backstop interval and in one
statement for all of them, which awaited jobs finished or are gone. A closed hub (shutdown)
wakes everybody and refuses new waits, so parked reads answer at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from app.domain.bounds import valid_id
from app.domain.records import Job
from app.domain.states import FINISHED
from app.errors import NotFound
from app.queue.waiters import wait_either
from app.store import Stores
from app.store.conn import Conn
from app.store.unit import TRANSACTION_TRIES, UnitOfWork

# The channel the trigger notifies on (app/store/sql/schema/finished.sql); the payload is the job id as text.
CHANNEL = "jobq_finished"


class ResultWaiter:
    """One parked read: the job it waits for and the event that wakes it."""

    __slots__ = ("event", "job_id")

    def __init__(self, job_id: int) -> None:
        self.job_id = job_id
        self.event = asyncio.Event()

    @property
    def woken(self) -> bool:
        """Whether something woke this waiter since it last armed."""
        return self.event.is_set()


class ResultHub:
    """Parks reads per job id and wakes every reader of a job when it finishes."""

    def __init__(self) -> None:
        self._by_job: dict[int, set[ResultWaiter]] = {}
        self._closed = False

    @property
    def closed(self) -> bool:
        """Whether the instance is shutting down."""
        return self._closed

    @property
    def parked(self) -> int:
        """How many reads are waiting now."""
        return sum(len(waiters) for waiters in self._by_job.values())

    def waiting_jobs(self) -> list[int]:
        """The ids of the jobs that have waiters not yet woken."""
        return [
            job_id for job_id, waiters in self._by_job.items() if any(not w.woken for w in waiters)
        ]

    def register(self, job_id: int) -> ResultWaiter:
        """Parks a waiter on a job (before its first read, so no wake-up is missed)."""
        waiter = ResultWaiter(job_id)
        if self._closed:
            waiter.event.set()
            return waiter
        self._by_job.setdefault(job_id, set()).add(waiter)
        return waiter

    def rearm(self, waiter: ResultWaiter) -> None:
        """Clears a woken waiter so it can be woken again (not once the hub is closed)."""
        if not self._closed:
            waiter.event.clear()

    def unregister(self, waiter: ResultWaiter) -> None:
        """Removes a waiter."""
        waiters = self._by_job.get(waiter.job_id)
        if waiters is None:
            return
        waiters.discard(waiter)
        if not waiters:
            del self._by_job[waiter.job_id]

    def notify(self, job_id: int) -> int:
        """Wakes every waiter of ``job_id``; answers how many woke."""
        woken = 0
        for waiter in self._by_job.get(job_id, ()):
            if not waiter.woken:
                waiter.event.set()
                woken += 1
        return woken

    def notify_all(self) -> int:
        """Wakes every waiter once (after a lost LISTEN connection, nobody may sleep through)."""
        return sum(self.notify(job_id) for job_id in list(self._by_job))

    def notified(self, payload: str | None) -> None:
        """The control channel's listener: a finished job's id, or ``None`` after a reconnect."""
        if payload is None:
            self.notify_all()
            return
        if payload.isdigit():  # anything else is not ours to understand
            self.notify(int(payload))

    def close(self) -> None:
        """Shutdown: wakes every waiter and makes later waits return at once."""
        self._closed = True
        self.notify_all()


class ResultService:
    """Awaiting results: a read that parks until its job finishes, and the backstop's check."""

    def __init__(self, *, unit: UnitOfWork, stores: Stores, hub: ResultHub) -> None:
        self.unit = unit
        self.stores = stores
        # Parked reads of this instance, woken by jobq_finished notifications.
        self.hub = hub

    async def wait(
        self, job_id: int, *, wait_seconds: float, stop: asyncio.Event | None = None
    ) -> Job:
        """One job, once it is finished (succeeded, dead, cancelled) or ``wait_seconds`` passed.

        A job finished already, or ``wait_seconds`` 0, is answered at once; ``NotFound`` for an
        unknown job, and for one deleted while waited for. Otherwise the job is marked awaited
        (one conditional UPDATE, so that its finish notifies ``jobq_finished`` from whichever
        instance finishes it) and the read parks in ``self.results`` holding no database
        connection. Woken by that notification, by the result backstop (which checks every
        parked job once per backstop interval, in case a notification was lost), after a
        reconnect of the control connection, or at shutdown, it re-reads the job and parks
        again while it is unfinished. It answers the job as it is when it finished, when the
        wait ends, when ``stop`` is set (the client went away) or when the instance shuts down.
        """
        if wait_seconds <= 0 or self.hub.closed:
            return await self._get(job_id)
        if not valid_id(job_id):
            raise NotFound(f"job {job_id} not found")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_seconds
        stop = stop or asyncio.Event()
        # Parked before the mark: a notification sent once the mark committed must find us.
        waiter = self.hub.register(job_id)
        try:
            row = await self._mark_awaited(job_id)
            while row.status not in FINISHED:
                remaining = deadline - loop.time()
                if remaining <= 0 or stop.is_set() or self.hub.closed:
                    return row
                await wait_either(waiter.event, stop, seconds=remaining)
                if stop.is_set():
                    return row  # nobody is listening for the answer
                self.hub.rearm(waiter)  # before the read: a later finish wakes us again
                row = await self._get(job_id)
            return row
        finally:
            self.hub.unregister(waiter)

    async def _mark_awaited(self, job_id: int) -> Job:
        """The job after marking it awaited, or as found when finished or awaited already."""
        self.unit.statements["await_mark"] += 1
        # Marking twice marks once.
        async for attempt in self.unit.hot(idempotent=True):
            async with attempt as conn:
                row = await self._mark(conn, job_id)
        if row is None:
            raise NotFound(f"job {job_id} not found")
        return row

    async def settled(self, job_ids: Sequence[int]) -> list[int]:
        """Which of these jobs are finished or gone (the result backstop's check)."""
        async for attempt in self.unit.ops():
            async with attempt as conn:
                settled = await self.stores.jobs.job_await_settled(conn, job_ids=job_ids)
        return settled

    async def _get(self, job_id: int) -> Job:
        """The job as it is now; ``NotFound`` when it is unknown or gone."""
        if not valid_id(job_id):
            raise NotFound(f"job {job_id} not found")
        async for attempt in self.unit.hot(idempotent=True):
            async with attempt as conn:
                row = await self.stores.jobs.job_get(conn, job_id=job_id)
        if row is None:
            raise NotFound(f"job {job_id} not found")
        return row

    async def _mark(self, conn: Conn, job_id: int) -> Job | None:
        """Marks the job awaited; when the mark takes nothing, reads why (finished, or gone)."""
        row: Job | None = None
        for _ in range(TRANSACTION_TRIES):
            row = await self.stores.jobs.job_await_mark(conn, job_id=job_id)
            if row is not None:
                return row
            # Finished, awaited already, or unknown: a read in a snapshot of its own (taken
            # after the mark, so it sees any finish the mark waited for) tells which.
            row = await self.stores.jobs.job_get(conn, job_id=job_id)
            if row is None or row.awaited or row.status in FINISHED:
                return row
            # Retried (finished, then back to pending) between the two statements: again.
        return row  # still moving: park anyway, the backstop has it
