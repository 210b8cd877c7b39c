"""Job states and which operations each allows (pure; the SQL enforces the same rules)."""

from __future__ import annotations

import enum


class JobStatus(enum.StrEnum):
    """A job's stored state; ``scheduled`` is derived: pending with ``run_at`` in the future."""

    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    DEAD = "dead"
    CANCELLED = "cancelled"


class VisibleStatus(enum.StrEnum):
    """A job's state as the API shows it and filters on."""

    SCHEDULED = "scheduled"
    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    DEAD = "dead"
    CANCELLED = "cancelled"


CANCELLABLE: frozenset[JobStatus] = frozenset({JobStatus.PENDING, JobStatus.RUNNING})
RETRYABLE: frozenset[JobStatus] = frozenset(
    {JobStatus.DEAD, JobStatus.CANCELLED, JobStatus.SUCCEEDED}
)
FINISHED: frozenset[JobStatus] = frozenset(
    {JobStatus.SUCCEEDED, JobStatus.DEAD, JobStatus.CANCELLED}
)


def can_cancel(status: JobStatus) -> bool:
    """Whether ``cancel`` moves a job in this state (a cancelled job answers as already done)."""
    return status in CANCELLABLE


def can_retry(status: JobStatus) -> bool:
    """Whether the ops ``retry`` may move a job in this state back to pending."""
    return status in RETRYABLE


def backoff_ceiling(*, attempt: int, base_seconds: float, cap_seconds: float) -> float:
    """The upper end of the retry delay after ``attempt``: base x 2^(attempt-1), capped.

    The SQL draws the actual delay uniformly from (0, ceiling] (full jitter); this mirrors
    its formula so the unit tests and the docs can state it.
    """
    exponent = min(max(attempt - 1, 0), 62)
    return float(min(cap_seconds, base_seconds * (2.0**exponent)))
