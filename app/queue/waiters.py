"""In-process registry of parked (long-polling) claims per queue; wakes about as many as jobs became available."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections import deque
from collections.abc import Iterable

# Announced as a queue name (which no queue can have), wakes every parked claim: a limit
# changed, and which queues hold the jobs it now lets through is not known.
ALL_QUEUES = "*"


class Waiter:
    """One parked claim: the queues it waits on and the event that wakes it."""

    __slots__ = ("event", "queues", "seq")

    def __init__(self, queues: frozenset[str], seq: int) -> None:
        self.queues = queues
        self.seq = seq
        self.event = asyncio.Event()

    @property
    def woken(self) -> bool:
        """Whether something woke this waiter since it last armed."""
        return self.event.is_set()


class WaiterHub:
    """Parks claims per queue and wakes them oldest first, one per available job.

    Waking is in-process and cheap; a woken waiter re-runs the claim statement, and if another
    claimer got there first it simply parks again. A closed hub (shutdown) wakes everybody and
    refuses new waits, so parked claims answer at once.
    """

    def __init__(self) -> None:
        self._by_queue: dict[str, deque[Waiter]] = {}
        self._seq = itertools.count()
        self._closed = False

    @property
    def closed(self) -> bool:
        """Whether the instance is shutting down."""
        return self._closed

    @property
    def parked(self) -> int:
        """How many distinct waiters are registered now."""
        return len({id(w) for q in self._by_queue.values() for w in q})

    def waiting_queues(self) -> list[str]:
        """The queues that have parked waiters not yet woken."""
        return [q for q, ws in self._by_queue.items() if any(not w.woken for w in ws)]

    def register(self, queues: Iterable[str]) -> Waiter:
        """Parks a waiter on these queues (before its claim attempt, so no wake-up is missed)."""
        waiter = Waiter(frozenset(queues), next(self._seq))
        if self._closed:
            waiter.event.set()
            return waiter
        for queue in waiter.queues:
            self._by_queue.setdefault(queue, deque()).append(waiter)
        return waiter

    def rearm(self, waiter: Waiter) -> None:
        """Clears a woken waiter so it can be woken again, moving it to the back of its queues."""
        if self._closed:
            return
        waiter.event.clear()
        for queue in waiter.queues:
            waiters = self._by_queue.setdefault(queue, deque())
            if waiter not in waiters:
                waiters.append(waiter)

    def unregister(self, waiter: Waiter) -> None:
        """Removes a waiter from every queue it waits on."""
        for queue in waiter.queues:
            waiters = self._by_queue.get(queue)
            if waiters is None:
                continue
            with contextlib.suppress(ValueError):
                waiters.remove(waiter)
            if not waiters:
                del self._by_queue[queue]

    def notify(self, queue: str, count: int = 1) -> int:
        """Wakes up to ``count`` waiters of ``queue``, oldest first; answers how many woke.

        ``ALL_QUEUES`` wakes every waiter."""
        if queue == ALL_QUEUES:
            return self.notify_all()
        waiters = self._by_queue.get(queue)
        woken = 0
        while waiters and woken < count:
            waiter = waiters.popleft()
            if waiter.woken:
                continue
            waiter.event.set()
            woken += 1
        if waiters is not None and not waiters:
            self._by_queue.pop(queue, None)
        return woken

    def notify_all(self) -> int:
        """Wakes every waiter once (after a lost LISTEN connection, nobody may sleep through)."""
        woken = 0
        for waiters in self._by_queue.values():
            for waiter in waiters:
                if not waiter.woken:
                    waiter.event.set()
                    woken += 1
            waiters.clear()
        self._by_queue.clear()
        return woken

    def close(self) -> None:
        """Shutdown: wakes every waiter and makes later waits return at once."""
        self._closed = True
        self.notify_all()


async def wait_either(first: asyncio.Event, second: asyncio.Event, *, seconds: float) -> None:
    """Waits until either event is set or ``seconds`` pass."""
    waits = [asyncio.ensure_future(first.wait()), asyncio.ensure_future(second.wait())]
    try:
        await asyncio.wait(waits, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in waits:
            task.cancel()
        for task in waits:
            with contextlib.suppress(asyncio.CancelledError):
                await task
