"""Typed rows: what the stores answer, each built once per row from either driver's row.

Each record's fields are its statement's columns, in their order. Pure: no I/O, no driver types.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import MISSING, Field, dataclass, field, fields
from datetime import datetime
from typing import Any, Self

_NAMES: dict[type, tuple[str, ...]] = {}
_OPTIONAL: dict[type, tuple[tuple[str, Callable[[], Any]], ...]] = {}


def _names(cls: type) -> tuple[str, ...]:
    names = _NAMES.get(cls)
    if names is None:
        required = [f for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING]
        names = _NAMES[cls] = tuple(f.name for f in required)
        _OPTIONAL[cls] = tuple((f.name, _default_of(f)) for f in fields(cls) if f not in required)
    return names


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
        values = [row[name] for name in _names(cls)]
        for name, default in _OPTIONAL[cls]:
            values.append(row[name] if name in row else default())
        return cls(*values)


@dataclass(frozen=True, slots=True)
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


@dataclass(frozen=True, slots=True)
class ReapedJob(Record):
    """A job the reaper moved: where it went, and whether it gave running slots of a limit back."""

    id: int
    queue: str
    status: str
    freed_flow: bool = False


@dataclass(frozen=True, slots=True)
class BulkCandidate(Record):
    """One candidate of a bulk action's batch, and whether the batch changed it."""

    id: int
    queue: str
    changed: bool


@dataclass(frozen=True, slots=True)
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


@dataclass(frozen=True, slots=True)
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


@dataclass(frozen=True, slots=True)
class QueueThroughput(Record):
    """How many jobs of one queue ended one way in one minute."""

    queue: str
    minute: datetime
    outcome: str
    jobs: int


@dataclass(frozen=True, slots=True)
class QueueSwitch(Record):
    """One row of ``queues``: whether the queue is paused."""

    name: str
    paused: bool
    updated_at: datetime


@dataclass(frozen=True, slots=True)
class QueuePut(QueueSwitch):
    """queue_put's answer: the queue's row and whether this call created the queue."""

    created: bool


@dataclass(frozen=True, slots=True)
class QueueDeleted(Record):
    """queue_delete's answer: whether the queue had a row, its jobs, and whether it was deleted."""

    known: bool
    unfinished: int
    finished: int
    deleted: bool


@dataclass(frozen=True, slots=True)
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


@dataclass(frozen=True, slots=True)
class FlowLimitUse(FlowLimit):
    """A limit and how many jobs run under it now (flow_limit_list)."""

    running: int


@dataclass(frozen=True, slots=True)
class FlowLimitSet(FlowLimit):
    """flow_limit_set's answer: the limit and whether it was new."""

    created: bool


@dataclass(frozen=True, slots=True)
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


@dataclass(frozen=True, slots=True)
class ScheduleAt(Schedule):
    """A schedule read with the database's clock it was judged or locked by.

    schedule_lock answers one row even when no schedule has the name: then every field but
    ``db_now`` is NULL, so its readers check ``name`` first.
    """

    db_now: datetime


@dataclass(frozen=True, slots=True)
class ScheduleWritten(Schedule):
    """schedule_upsert's answer: the schedule written and whether it was new."""

    created: bool


@dataclass(frozen=True, slots=True)
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


@dataclass(frozen=True, slots=True)
class KeyRow(Record):
    """An API key as listed (never its secret's hash)."""

    id: int
    name: str
    role: str
    queues: list[str] | None
    created_at: datetime
    revoked_at: datetime | None


@dataclass(frozen=True, slots=True)
class KeyPrincipal(Record):
    """What a live key authenticates as: its id, name, role and queue scopes."""

    id: int
    name: str
    role: str
    queues: list[str] | None


@dataclass(frozen=True, slots=True)
class LiveKey(KeyPrincipal):
    """A live key with its secret's hash (the key cache's load)."""

    secret_sha256: bytes
