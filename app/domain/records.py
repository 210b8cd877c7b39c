"""Typed rows: what the stores answer, each built once per row from either driver's row.

Each record's fields are its statement's columns, in their order. Pure: no I/O, no driver types.

Records are read-only by convention, not ``frozen``: a frozen dataclass sets each field through
``object.__setattr__``, and building a 35-field ``Job`` took 4.3 µs against 0.7 µs for a plain
slotted one filled by ``operator.itemgetter`` (measured with timeit), which a 500-job batch
enqueue or a 50-job claim pays per row.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping
from dataclasses import MISSING, Field, dataclass, field, fields
from datetime import datetime
from typing import Any, Self

from app.domain.states import is_retrying

_GETTERS: dict[type, Callable[[Mapping[str, Any]], tuple[Any, ...]]] = {}
_OPTIONAL: dict[type, tuple[tuple[str, Callable[[], Any]], ...]] = {}
# Fields that are not columns (metadata column=False): their defaults, after the columns.
_EXTRA: dict[type, tuple[Callable[[], Any], ...]] = {}


def _getter(cls: type) -> Callable[[Mapping[str, Any]], tuple[Any, ...]]:
    """Reads a record's required fields from a row in one C call (operator.itemgetter)."""
    getter = _GETTERS.get(cls)
    if getter is None:
        required = [f for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING]
        names = [f.name for f in required]
        if len(names) == 1:
            one = operator.itemgetter(names[0])
            getter = lambda row: (one(row),)  # noqa: E731
        else:
            getter = operator.itemgetter(*names)
        _GETTERS[cls] = getter
        _OPTIONAL[cls] = tuple(
            (f.name, _default_of(f))
            for f in fields(cls)
            if f not in required and f.metadata.get("column", True)
        )
        _EXTRA[cls] = tuple(
            _default_of(f) for f in fields(cls) if not f.metadata.get("column", True)
        )
    return getter


def _default_of(spec: Field[Any]) -> Callable[[], Any]:
    if spec.default_factory is not MISSING:
        return spec.default_factory
    value = spec.default
    return lambda: value


class Record:
    """A typed row: built from a row holding (at least) its fields; ``record.field`` reads it."""

    __slots__ = ()

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Self:
        """The record of a row (an asyncpg Record or SQLAlchemy RowMapping) with its fields.

        A field with a default is a column newer than the previous release's statement (which
        runs during a rolling deploy, tests/api/previous_release/): it may be missing.
        """
        values = _getter(cls)(row)
        optional = _OPTIONAL[cls]
        if optional:
            values = (*values, *(row[n] if n in row else make() for n, make in optional))
        extra = _EXTRA[cls]
        if extra:
            values = (*values, *(make() for make in extra))
        return cls(*values)


@dataclass(slots=True)
class JobHead(Record):
    """What a created job's lean enqueue answers: enough to answer its id and announce it."""

    id: int
    queue: str
    type: str
    status: str


@dataclass(slots=True)
class Job(Record):
    """One row of ``jobs``: every column, in the table's order."""

    id: int
    queue: str
    type: str
    payload: Any
    priority: int
    status: str
    attempts: int
    max_attempts: int
    run_at: datetime
    lease_id: Any | None
    worker_id: str | None
    lease_expires_at: datetime | None
    lease_seconds: int
    idempotency_key: str | None
    idempotency_hash: str | None
    result: Any | None
    last_error: str | None
    errors: Any
    checkpoint: Any | None
    checkpoint_at: datetime | None
    progress: Any | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    updated_at: datetime
    timeout_seconds: int | None
    lease_granted_seconds: int | None
    lease_ended_by: str | None
    lease_key_id: int | None
    lease_instance: str | None
    concurrency_key: str | None
    flow_keys: list[str] | None
    awaited: bool
    schedule_name: str | None
    scheduled_for: datetime | None
    progress_at: datetime | None
    traceparent: str | None
    # Every statement reading jobs answers all of their columns (SELECT * / RETURNING j.*), and
    # the schema is migrated before any instance runs, so these are read like the others: a
    # column read as optional costs a key lookup per row (measured: 3.6 -> 7.8 us a row with
    # the nine columns of migrations 0020 and 0021 optional).
    callback_url: str | None  # migration 0020
    callback_key_id: int | None
    depends_on: list[int] | None  # migration 0021
    on_parent_failure: str | None
    has_dependents: bool
    ordering_key: str | None
    workflow_id: int | None
    workflow_step: str | None
    # Not a column: what a claim hands a job with parents (JobService fills it in), else None.
    parents: Any = field(default=None, metadata={"column": False})

    @property
    def retrying(self) -> bool:
        """Scheduled to run again after a failure's (or an expired lease's) backoff."""
        return is_retrying(self.status, self.lease_ended_by)


@dataclass(slots=True)
class ReapedJob(Record):
    """A job the reaper moved: where it went, and whether it gave running slots of a limit back."""

    id: int
    queue: str
    status: str
    freed_flow: bool = False
    type: str | None = None  # a column newer than the previous release's statement


@dataclass(slots=True)
class BulkCandidate(Record):
    """One candidate of a bulk action's batch, and whether the batch changed it."""

    id: int
    queue: str
    changed: bool


@dataclass(slots=True)
class WorkerLeases(Record):
    """A worker holding leases now: its id within its key, its jobs and their lease expiries."""

    worker_id: str
    key_name: str | None
    jobs_held: int
    job_ids: list[int]
    next_lease_expiry: datetime
    last_seen_at: datetime
    lease_expiries: list[datetime] = field(default_factory=list)
    instance: str | None = None


@dataclass(slots=True)
class QueueStats(Record):
    """One queue's switch and counts per state, from the counters (queue_stats)."""

    name: str
    paused: bool
    scheduled: int
    pending: int
    running: int
    succeeded: int
    dead: int
    cancelled: int
    oldest_pending_age_seconds: float | None
    succeeded_last_minute: int
    retrying: int = 0  # of the scheduled ones (a column newer than the previous release's)
    waiting: int = 0  # waiting for other jobs (migration 0021)
    callback_url: str | None = None  # migration 0020


@dataclass(slots=True)
class QueueThroughput(Record):
    """How many jobs of one queue ended one way in one minute."""

    queue: str
    minute: datetime
    outcome: str
    jobs: int


@dataclass(slots=True)
class QueueWindowStats(Record):
    """One queue's finished jobs over one window (queue_window_stats): outcomes, attempts, and
    the p50 / p95 / p99 seconds of the last attempt's wait (due -> claim) and run (claim -> end).

    Read from the queue's newest finished jobs (``scanned`` rows); ``truncated``: the window may
    hold more than were read. A percentile is ``None`` when no job of the window has the figure.
    """

    queue: str
    known: bool  # the queue exists (a row of its own, or jobs)
    window_seconds: float
    since: datetime
    succeeded: int
    dead: int
    cancelled: int
    attempts: int  # of the jobs that succeeded or went dead
    failed_attempts: int
    wait_jobs: int
    wait_p50: float | None
    wait_p95: float | None
    wait_p99: float | None
    run_jobs: int
    run_p50: float | None
    run_p95: float | None
    run_p99: float | None
    scanned: int
    truncated: bool

    @property
    def finished(self) -> int:
        """Jobs that finished in the window: succeeded, dead or cancelled."""
        return self.succeeded + self.dead + self.cancelled

    @property
    def dead_rate(self) -> float | None:
        """Dead jobs divided by finished jobs (``None`` when none finished)."""
        return self.dead / self.finished if self.finished else None

    @property
    def failed_attempt_rate(self) -> float | None:
        """Failed attempts divided by attempts, of the jobs that succeeded or went dead."""
        return self.failed_attempts / self.attempts if self.attempts else None


@dataclass(slots=True)
class QueueSwitch(Record):
    """One row of ``queues``: whether the queue is paused."""

    name: str
    paused: bool
    updated_at: datetime
    callback_url: str | None = None  # migration 0020


@dataclass(slots=True)
class QueuePut(QueueSwitch):
    """queue_put's answer: the queue's row and whether this call created the queue."""

    created: bool = False


@dataclass(slots=True)
class QueueDeleted(Record):
    """queue_delete's answer: whether the queue had a row, its jobs, and whether it was deleted."""

    known: bool
    unfinished: int
    finished: int
    deleted: bool


@dataclass(slots=True)
class FlowLimit(Record):
    """One row of ``flow_limits``: a concurrency and / or rate limit on keys or queues."""

    id: int
    scope: str
    pattern: str
    like_pattern: str
    max_running: int | None
    rate_limit: int | None
    rate_per_seconds: float | None
    created_at: datetime
    updated_at: datetime


@dataclass(slots=True)
class FlowLimitUse(FlowLimit):
    """A limit and how many jobs run under it now (flow_limit_list)."""

    running: int


@dataclass(slots=True)
class FlowLimitSet(FlowLimit):
    """flow_limit_set's answer: the limit and whether it was new."""

    created: bool


@dataclass(slots=True)
class Schedule(Record):
    """One row of ``schedules``: a periodic job's definition and where it stands."""

    name: str
    cron: str | None
    interval_seconds: int | None
    timezone: str
    queue: str
    type: str
    payload: Any
    priority: int
    max_attempts: int | None
    lease_seconds: int | None
    timeout_seconds: int | None
    concurrency_key: str | None
    catch_up: int
    paused: bool
    next_run_at: datetime
    last_run_at: datetime | None
    last_job_id: int | None
    source: str
    created_at: datetime
    updated_at: datetime
    last_error: str | None
    errored_at: datetime | None


@dataclass(slots=True)
class ScheduleAt(Schedule):
    """A schedule read with the database's clock it was judged or locked by.

    schedule_lock answers one row even when no schedule has the name: then every field but
    ``db_now`` is NULL, so its readers check ``name`` first.
    """

    db_now: datetime


@dataclass(slots=True)
class ScheduleWritten(Schedule):
    """schedule_upsert's answer: the schedule written and whether it was new."""

    created: bool


@dataclass(slots=True)
class ScheduleTriggered:
    """schedule_trigger's answer: the schedule's queue, and the job enqueued from its template
    (``None`` when the queue was outside the caller's scopes and nothing was enqueued)."""

    queue: str
    job: Job | None


@dataclass(slots=True)
class AuditEntry(Record):
    """One row of ``audit_log``: an admin action, who made it and what it changed."""

    id: int
    at: datetime
    actor: str
    actor_key_id: int | None
    action: str
    outcome: str
    queue: str | None
    job_id: int | None
    key_name: str | None
    state_before: str | None
    state_after: str | None
    detail: Any | None


@dataclass(slots=True)
class KeyRow(Record):
    """An API key as listed (never its secret's hash)."""

    id: int
    name: str
    role: str
    queues: list[str] | None
    created_at: datetime
    revoked_at: datetime | None


@dataclass(slots=True)
class KeyPrincipal(Record):
    """What a live key authenticates as: its id, name, role and queue scopes."""

    id: int
    name: str
    role: str
    queues: list[str] | None


@dataclass(slots=True)
class LiveKey(KeyPrincipal):
    """A live key with its secret's hash (the key cache's load)."""

    secret_sha256: bytes


@dataclass(slots=True)
class JobHistoryEntry(Record):
    """One event of a job's history (``job_event_list``): stored in ``job_events``, or read from
    the job's own columns (enqueued, the current attempt's claim, completed), then with id 0."""

    id: int
    at: datetime
    kind: str
    attempt: int | None
    actor: str | None
    actor_key_id: int | None
    instance: str | None
    data: Any
    key_name: str | None


@dataclass(slots=True)
class WorkerSeen(Record):
    """A worker seen claiming lately, or holding leases (``worker_overview``)."""

    worker_id: str
    key_name: str | None
    queues: list[str]
    instance: str | None
    first_seen_at: datetime | None  # None: holds leases, but not seen claiming lately
    last_seen_at: datetime | None
    live: bool
    jobs_held: int
    job_ids: list[int]
    job_types: list[str]
    job_started: list[datetime]
    lease_expiries: list[datetime]
    next_lease_expiry: datetime | None


@dataclass(slots=True)
class JobBlockers(Record):
    """What may hold one job back now (``job_blockers``)."""

    id: int
    status: str
    queue: str
    concurrency_key: str | None
    run_at: datetime
    queue_paused: bool
    key_running: int | None
    key_max_running: int | None
    key_blocked_until: datetime | None
    queue_running: int | None
    queue_max_running: int | None
    queue_blocked_until: datetime | None
    live_workers: int
    # A waiting job's (migration 0021): its unfinished parents, its key's job that goes first.
    parents_open: list[int] | None = None
    ordering_key: str | None = None
    ordering_ahead: int | None = None
