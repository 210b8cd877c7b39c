"""In-process registry of parked job reads (``GET /v1/jobs/{id}?wait_seconds=``) per job id.

A read that waits for its job to finish parks here and holds no database connection. It is
woken by the job's finish, on whichever instance that happened: a row trigger on ``jobs``
(migration 0012) sends ``pg_notify('jobq_finished', <id>)`` when an *awaited* job reaches
``succeeded``, ``dead`` or ``cancelled``, or is deleted, and the control connection
(app/wakeup/control.py) hands each payload to :meth:`ResultHub.notified`. A woken waiter
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

# The channel the trigger notifies on (migration 0012); the payload is the job id as text.
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
