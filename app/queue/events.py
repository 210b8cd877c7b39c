"""Where every committed state change is announced: job events to subscribers, wake-ups to waiters.

The services call :meth:`Events.publish` with the job events of a change once it committed,
and :meth:`Events.wake` (or :meth:`Events.wake_queues`) when the change made jobs claimable or
freed running slots of a limit. Who listens is decided once, where the lifespan builds the
services (app/main.py): the log lines (app/logs.py), the metrics (app/api/metrics.py) subscribe
to the events; the wake-ups go to the control channel, which wakes the waiting claims here and,
through NOTIFY, on every other instance. No route or loop subscribes at run time.

Subscribers run inline after the commit, so they must not block: a counter, a log line.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Sequence

from app.domain.types import JobEvent

# Wakes up to ``count`` claims waiting on ``queue`` (waiters.ALL_QUEUES: every queue).
Wake = Callable[[str, int], object]
Subscriber = Callable[[Sequence[JobEvent]], object]


class Events:
    """Hands committed job events to the subscribers and wake-ups to the waiters."""

    def __init__(self, wake: Wake | None = None) -> None:
        self._wake: Wake = wake or _wake_nobody
        self._subscribers: list[Subscriber] = []

    def subscribe(self, subscriber: Subscriber) -> None:
        """Adds a subscriber of job events (once; at start-up)."""
        if subscriber not in self._subscribers:
            self._subscribers.append(subscriber)

    def wake_with(self, wake: Wake) -> None:
        """Sends later wake-ups to ``wake`` (the lifespan's control channel)."""
        self._wake = wake

    def publish(self, events: Sequence[JobEvent]) -> None:
        """Tells every subscriber of the events of a committed change."""
        if events:
            for subscriber in self._subscribers:
                subscriber(events)

    def wake(self, queue: str, count: int) -> None:
        """Wakes up to ``count`` claims waiting on ``queue``."""
        self._wake(queue, count)

    def wake_queues(self, queues: Iterable[str]) -> None:
        """Wakes one waiting claim per occurrence of each queue."""
        for queue, count in Counter(queues).items():
            self._wake(queue, count)


def _wake_nobody(queue: str, count: int) -> None:
    """Wake-ups with nobody waiting (a service built without waiters, as in loop tests)."""
