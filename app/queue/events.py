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

from app.domain.records import Job, JobHead
from app.domain.states import JobStatus
from app.domain.types import JobEvent, LeaseOutcome, LeaseTransition, LeaseUpdate

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

    def created(self, rows: Iterable[Job | JobHead]) -> None:
        """Announces the jobs a committed enqueue created; wakes a waiting claim per due one."""
        events = [JobEvent("enqueued", row.id, row.queue, row.status, row.type) for row in rows]
        self.publish(events)
        self.wake_queues(e.queue for e in events if e.status == JobStatus.PENDING)

    def wake_queues(self, queues: Iterable[str]) -> None:
        """Wakes one waiting claim per occurrence of each queue."""
        for queue, count in Counter(queues).items():
            self._wake(queue, count)


def _wake_nobody(queue: str, count: int) -> None:
    """Wake-ups with nobody waiting (a service built without waiters, as in loop tests)."""


def claimed_events(rows: Sequence[Job], worker_id: str, key_id: int | None) -> list[JobEvent]:
    """The events of a committed claim: one per job leased to the worker."""
    return [
        JobEvent(
            "claimed",
            row.id,
            row.queue,
            status=row.status,
            type=row.type,
            worker_id=worker_id,
            key_id=key_id,
            attempt=row.attempts,
            waited_seconds=_waited(row),
        )
        for row in rows
    ]


def lease_events(
    transition: LeaseTransition,
    items: Sequence[LeaseUpdate],
    outcomes: Sequence[LeaseOutcome],
    changed: Iterable[int],
) -> list[JobEvent]:
    """The events of a committed complete, fail or release: one per item it changed (by
    position; a replay's verdict changed nothing)."""
    return [
        JobEvent(
            _lease_event(transition, outcomes[i].status),
            outcomes[i].job_id,
            outcomes[i].queue or "",
            status=outcomes[i].status,
            type=outcomes[i].type,
            worker_id=items[i].worker_id,
            key_id=items[i].key_id,
            ran_seconds=outcomes[i].ran_seconds,
        )
        for i in sorted(changed)
    ]


def _waited(row: Job) -> float:
    """Seconds a claimed job was due before its claim, from the row's own (PostgreSQL) times."""
    started = row.started_at or row.run_at  # a claimed row always has started_at
    waited: float = (started - row.run_at).total_seconds()
    return max(waited, 0.0)


def _lease_event(transition: LeaseTransition, status: str | None) -> str:
    """The event of a lease call that changed its job."""
    if transition is LeaseTransition.COMPLETE:
        return "completed"
    if transition is LeaseTransition.RELEASE:
        return "released"
    return "dead" if status == JobStatus.DEAD else "failed"
