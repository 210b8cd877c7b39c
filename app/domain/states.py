"""Job states and the transitions between them, as a table (pure).

The SQL in ``sql/jobs.sql`` decides every transition; this table states the same rules for
readers, the docs and error messages. ``tests/integration/test_transition_table.py`` runs each
statement against a job in each state on a real database and checks that the two agree, so
this is a description that cannot drift, not a second implementation.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping


class JobStatus(enum.StrEnum):
    """A job's stored state."""

    SCHEDULED = "scheduled"  # waiting for its run_at; the promoter moves it to pending
    PENDING = "pending"  # due: claimable
    RUNNING = "running"  # leased to a worker
    SUCCEEDED = "succeeded"
    DEAD = "dead"
    CANCELLED = "cancelled"
    # Waiting for other jobs (migration 0021): its parents (depends_on), or the earlier jobs of
    # its ordering key. Outside the claim index like scheduled; the triggers in schema/linked.sql
    # move it (TRIGGERED below).
    WAITING = "waiting"


class JobState(enum.StrEnum):
    """What a listing filters by: a stored state, or ``retrying`` (scheduled after a failure)."""

    SCHEDULED = "scheduled"
    RETRYING = "retrying"
    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    DEAD = "dead"
    CANCELLED = "cancelled"
    WAITING = "waiting"


class Operation(enum.StrEnum):
    """What moves a job; outcome variants (retried or final) are separate operations."""

    PROMOTE = "promote"  # run_at came
    CLAIM = "claim"
    COMPLETE = "complete"
    FAIL_RETRY = "fail (attempts left, with backoff)"
    FAIL_RETRY_NOW = "fail (attempts left, retry_after_seconds 0)"
    FAIL_FINAL = "fail (not retryable, or last attempt)"
    RELEASE = "release"
    RELEASE_DELAYED = "release (delay_seconds > 0)"
    REAP_RETRY = "reap (lease expired, attempts left)"
    REAP_FINAL = "reap (lease expired on the last attempt)"
    CANCEL = "cancel"
    RETRY = "retry"
    RUN_NOW = "run now"


# (operation, state before) -> state after. A pair that is absent is refused in that state.
TRANSITIONS: Mapping[tuple[Operation, JobStatus], JobStatus] = {
    (Operation.PROMOTE, JobStatus.SCHEDULED): JobStatus.PENDING,
    (Operation.CLAIM, JobStatus.PENDING): JobStatus.RUNNING,
    (Operation.COMPLETE, JobStatus.RUNNING): JobStatus.SUCCEEDED,
    (Operation.FAIL_RETRY, JobStatus.RUNNING): JobStatus.SCHEDULED,
    (Operation.FAIL_RETRY_NOW, JobStatus.RUNNING): JobStatus.PENDING,
    (Operation.FAIL_FINAL, JobStatus.RUNNING): JobStatus.DEAD,
    (Operation.RELEASE, JobStatus.RUNNING): JobStatus.PENDING,
    (Operation.RELEASE_DELAYED, JobStatus.RUNNING): JobStatus.SCHEDULED,
    (Operation.REAP_RETRY, JobStatus.RUNNING): JobStatus.SCHEDULED,
    (Operation.REAP_FINAL, JobStatus.RUNNING): JobStatus.DEAD,
    (Operation.CANCEL, JobStatus.SCHEDULED): JobStatus.CANCELLED,
    (Operation.CANCEL, JobStatus.PENDING): JobStatus.CANCELLED,
    (Operation.CANCEL, JobStatus.RUNNING): JobStatus.CANCELLED,
    (Operation.CANCEL, JobStatus.WAITING): JobStatus.CANCELLED,
    (Operation.RETRY, JobStatus.SUCCEEDED): JobStatus.PENDING,
    (Operation.RETRY, JobStatus.DEAD): JobStatus.PENDING,
    (Operation.RETRY, JobStatus.CANCELLED): JobStatus.PENDING,
    (Operation.RUN_NOW, JobStatus.SCHEDULED): JobStatus.PENDING,
}

# What no request does but a job's parents (or its ordering key's earlier job) ending does, in
# the same transaction, by the triggers in app/store/sql/schema/linked.sql: waiting -> pending
# (scheduled when its run_at is ahead) once every parent ended as it asks, or its key's turn
# came; waiting -> cancelled when a parent ended dead or cancelled and the job asked for success.
# tests/integration/test_dependencies.py holds the SQL to it.
TRIGGERED: Mapping[JobStatus, frozenset[JobStatus]] = {
    JobStatus.WAITING: frozenset({JobStatus.PENDING, JobStatus.SCHEDULED, JobStatus.CANCELLED}),
}

# A scheduled job is *retrying* (waiting out a backoff) when its last lease ended in a failure,
# an expiry or a timeout; otherwise it is scheduled for later (a delay, a release with a delay).
# Not a state of its own: the column keeps six states, and ix_jobs_retrying (migration 0017)
# holds these rows.
RETRY_LEASE_ENDS = frozenset({"fail", "expire", "timeout"})


def is_retrying(status: str, lease_ended_by: str | None) -> bool:
    """Whether a job in ``status`` whose last lease ended by ``lease_ended_by`` is retrying."""
    return status == JobStatus.SCHEDULED and lease_ended_by in RETRY_LEASE_ENDS


FINISHED: frozenset[JobStatus] = frozenset(
    {JobStatus.SUCCEEDED, JobStatus.DEAD, JobStatus.CANCELLED}
)


class BulkAction(enum.StrEnum):
    """What a bulk action does to the jobs of a search (``POST /v1/jobs/bulk/{action}``)."""

    RETRY = "retry"
    CANCEL = "cancel"
    DELETE = "delete"


# Per bulk action: the states it may touch, and the ones it touches when the search names no
# state. Retry takes dead jobs unless the search names cancelled or succeeded ones: re-running
# what someone cancelled or what already succeeded should be asked for. Cancel leaves running
# jobs alone: ending leases wholesale is a decision made job by job (POST /v1/jobs/{id}/cancel).
BULK_STATES: Mapping[BulkAction, tuple[frozenset[JobStatus], frozenset[JobStatus]]] = {
    BulkAction.RETRY: (
        frozenset({JobStatus.DEAD, JobStatus.CANCELLED, JobStatus.SUCCEEDED}),
        frozenset({JobStatus.DEAD}),
    ),
    BulkAction.CANCEL: (
        frozenset({JobStatus.SCHEDULED, JobStatus.PENDING, JobStatus.WAITING}),
        frozenset({JobStatus.SCHEDULED, JobStatus.PENDING, JobStatus.WAITING}),
    ),
    BulkAction.DELETE: (
        frozenset({JobStatus.SUCCEEDED, JobStatus.DEAD, JobStatus.CANCELLED}),
        frozenset({JobStatus.SUCCEEDED, JobStatus.DEAD, JobStatus.CANCELLED}),
    ),
}


def bulk_states_allowed(action: BulkAction) -> frozenset[JobStatus]:
    """Every state ``action`` may touch when a search names it."""
    return BULK_STATES[action][0]


def bulk_states(action: BulkAction, named: JobStatus | None) -> list[JobStatus] | None:
    """The states ``action`` touches for a search naming ``named``; ``None``: it may not touch it."""
    allowed, default = BULK_STATES[action]
    if named is None:
        return [s for s in JobStatus if s in default]
    return [named] if named in allowed else None


def allowed_from(operation: Operation) -> list[JobStatus]:
    """The states in which ``operation`` moves a job, in the order of :class:`JobStatus`."""
    return [s for s in JobStatus if (operation, s) in TRANSITIONS]


def backoff_ceiling(*, attempt: int, base_seconds: float, cap_seconds: float) -> float:
    """The upper end of the retry delay after ``attempt``: base x 2^(attempt-1), capped.

    ``jobq_backoff`` (app/store/sql/schema/helpers.sql) draws the delay uniformly from
    (0, ceiling]; a test checks its draws against this ceiling on a real database.
    """
    exponent = min(max(attempt - 1, 0), 62)
    return float(min(cap_seconds, base_seconds * (2.0**exponent)))


def states_of(operation: Operation) -> str:
    """The states ``operation`` may start from, for an error message."""
    return ", ".join(s.value for s in allowed_from(operation))
