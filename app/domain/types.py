"""The queue core's own value types: what callers hand in and what the core answers (no wire models)."""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from app.domain.bounds import TRACEBACK_MAX_CHARS
from app.domain.records import Job
from app.domain.states import BulkAction, JobStatus


class NotGiven(enum.Enum):
    """A field the caller left out, which keeps what is stored; ``None`` is a value that clears it."""

    NOT_GIVEN = "not given"


NOT_GIVEN = NotGiven.NOT_GIVEN


# A worker is live while it was seen claiming (or heartbeating a job it holds) this recently:
# three times the longest long-poll (20 s), so a worker parked in a long poll stays live.
WORKER_LIVE_SECONDS = 60.0


@dataclass(slots=True)  # read-only by convention: per item of a 50-job call
class LeaseUpdate:
    """One lease named in a heartbeat, complete, fail or release, and what the worker reports.

    The service fills in ``worker_id`` and ``key_id`` from the call (every lease of a call
    belongs to its worker). Each transition reads its own fields: heartbeat ``lease_seconds``,
    ``checkpoint`` and ``progress``; complete ``result``; fail ``error``, ``retryable``,
    ``retry_after_seconds``, ``checkpoint`` and, when the worker sent a structured error,
    ``error_type``, ``traceback`` and the traceback's ``fingerprint``
    (:func:`app.domain.fingerprints.failure_fingerprint`, what groups it with failures of the
    same cause); release ``delay_seconds`` and ``checkpoint``.
    """

    job_id: int
    lease_id: str
    worker_id: str = ""
    key_id: int | None = None
    lease_seconds: int | None = None  # None: the lease length the claim asked for
    checkpoint: Any | NotGiven = NOT_GIVEN  # any JSON value, None included
    progress: Any | NotGiven = NOT_GIVEN
    result: Any = None
    error: str = ""  # the message (the whole error text when it came as a string)
    error_type: str | None = None
    traceback: str | None = None
    fingerprint: str | None = None  # None: no traceback, or none with a frame
    retryable: bool = True
    retry_after_seconds: float | None = None  # None: the backoff
    delay_seconds: float = 0.0


def owned_by(items: Sequence[LeaseUpdate], worker_id: str, key_id: int | None) -> list[LeaseUpdate]:
    """The items as the calling worker's (its id within its API key): the route builds them so
    already; others (a claim handing its jobs back) are copied."""
    return [
        item
        if item.worker_id == worker_id and item.key_id == key_id
        else replace(item, worker_id=worker_id, key_id=key_id)
        for item in items
    ]


class LeaseTransition(enum.StrEnum):
    """The calls a lease holder makes; each of the last three ends the lease."""

    HEARTBEAT = "heartbeat"
    COMPLETE = "complete"
    FAIL = "fail"
    RELEASE = "release"


@dataclass(slots=True)  # read-only by convention: per item of a 50-job call
class JobEvent:
    """A committed change of one job's state, for observers (metrics, logs) of the service.

    ``kind`` is one of enqueued, claimed, completed, failed (a retry is scheduled), dead,
    released, reaped (an expired lease went back to the queue or to dead), cancelled, retried.
    """

    kind: str
    job_id: int
    queue: str
    status: str | None = None  # the job's state after the change
    type: str | None = None  # the job's type (None where the statement did not read it)
    worker_id: str | None = None
    key_id: int | None = None
    attempt: int | None = None
    # From the row's PostgreSQL times: run_at to the claim (claimed), the claim to the end of
    # the attempt (completed, failed, dead); None for the other kinds.
    waited_seconds: float | None = None
    ran_seconds: float | None = None


@dataclass(slots=True)  # read-only by convention: per item of a 50-job call
class ClaimSlot:
    """One job a claim asks for: who gets its lease (the worker id within its API key), for how long."""

    worker_id: str
    key_id: int | None = None
    lease_seconds: int | None = None  # None: the job's own lease length


@dataclass(frozen=True)
class ClaimAsk:
    """A claim a complete, fail or release makes after its transition, for the same worker:
    POST /v1/claim's fields but the worker (app/queue/chained.py)."""

    queues: tuple[str, ...]
    max_jobs: int = 1
    lease_seconds: int | None = None  # None: each job's own lease length
    wait_seconds: float = 0.0  # long-poll this long, after the transition committed


@dataclass(frozen=True)
class ClaimOutcome:
    """What one claim statement took, per slot, and what it says of the limits it met."""

    by_slot: list[Job | None]
    # Limited flow_state rows the statement needed but found missing: create them, claim again.
    flow_missing: tuple[str, ...] = ()
    # The keys whose flow_state rows other transactions held (their jobs were skipped): a claim
    # again waits for them (flow_state_lock) rather than skipping them once more.
    flow_skipped: tuple[str, ...] = ()
    # How many candidates a limit refused; their rows now say they are full, so a claim again
    # passes over them to the next eligible jobs.
    flow_refused: int = 0
    # Seconds until the first empty token bucket it saw refills one token (None: none empty).
    flow_refill_seconds: float | None = None
    # Whether any limit exists: claims read a wider window of candidates while one does.
    flow_active: bool = False


@dataclass(slots=True)  # not frozen: a frozen init costs ~3 us a job of a batch
class NewJob:
    """One job to enqueue, with defaults already applied by the caller's policy (or left ``None``).

    ``fingerprint`` identifies the request for idempotency: the same key with another
    fingerprint is a reuse, not a replay.
    """

    queue: str
    type: str
    payload: Any = None
    priority: int = 0
    run_at: datetime | None = None
    delay_seconds: float | None = None
    max_attempts: int | None = None
    lease_seconds: int | None = None
    timeout_seconds: int | None = None
    idempotency_key: str | None = None
    fingerprint: str | None = None
    concurrency_key: str | None = None
    traceparent: str | None = None  # W3C trace context, handed to the worker with the claim
    # Composing work (migration 0021): the jobs this one waits for and what a parent ending
    # dead or cancelled does to it (None: cancel it too); the key whose jobs run one at a time.
    depends_on: tuple[int, ...] | None = None
    on_parent_failure: str | None = None
    ordering_key: str | None = None
    # Set by the workflow service only: the step's reserved id, its workflow and name, and
    # whether other steps wait for it.
    id: int | None = None
    workflow_id: int | None = None
    workflow_step: str | None = None
    has_dependents: bool = False
    # Where the outcome is POSTed when the job finishes (None: the queue's default, if any),
    # and the API key whose webhook secret signs it (None: JOBQ_WEBHOOK_SECRET).
    callback_url: str | None = None
    callback_key_id: int | None = None


@dataclass(frozen=True, slots=True)
class PlainJobs:
    """Jobs of one call that need their insert and nothing else: no idempotency key, no
    parents, no ordering key, no batch callback, so none can be a replay or wait for a lock.

    Each item holds only the fields its producer set, named as :class:`NewJob`'s, as validated
    (``run_at`` an aware datetime); the enqueue statement fills in the rest, and ``traceparent``
    and ``callback_key_id`` are the call's. A batch of 500 reaches its statement this way
    without a :class:`NewJob`, a copy with defaults and a parameter dict per job.
    """

    items: Sequence[Mapping[str, Any]]
    traceparent: str | None = None
    callback_key_id: int | None = None


@dataclass(slots=True)  # read-only by convention: per item of a 50-job call
class LeaseOutcome:
    """The verdict for one lease item of a heartbeat / complete / fail / release call."""

    job_id: int
    status: str | None
    cancelled: bool = False
    timed_out: bool = False
    lease_expires_at: datetime | None = None
    run_at: datetime | None = None
    queue: str | None = None
    type: str | None = None
    # Seconds from the claim to this call's end of the attempt (complete, fail), by PostgreSQL.
    ran_seconds: float | None = None
    # Whether the job gave back running slots of a concurrency limit (other jobs may now run).
    freed_flow: bool = False

    @property
    def ok(self) -> bool:
        """Whether the caller held the lease (or is repeating the call that ended it)."""
        return self.status is not None

    @property
    def claimable_now(self) -> bool:
        """Whether this call made the job claimable at once (waiters should hear of it)."""
        return self.status == JobStatus.PENDING and self.queue is not None


@dataclass(frozen=True)
class EnqueueLimits:
    """What ``jobq.enqueue()`` (the SQL function, app/store/sql/schema/enqueue.sql) checks and
    fills in, as the API does: an instance writes its own at start-up."""

    queue_name_max_chars: int
    type_max_chars: int
    idempotency_key_max_chars: int
    concurrency_key_max_chars: int
    payload_max_bytes: int
    max_attempts_default: int
    lease_seconds_default: int
    json_max_depth: int  # containers nested deeper than this are refused (migration 0025)


@dataclass(frozen=True)
class Retention:
    """How long finished jobs are kept, per state, before the pruner deletes them."""

    succeeded_seconds: float
    cancelled_seconds: float
    dead_seconds: float

    def params(self) -> dict[str, float]:
        """The retentions as the prune statements' binds."""
        return {
            "succeeded_seconds": self.succeeded_seconds,
            "cancelled_seconds": self.cancelled_seconds,
            "dead_seconds": self.dead_seconds,
        }


@dataclass(frozen=True)
class JobDefaults:
    """What a job gets when its producer leaves a field out; shared by enqueue and schedule runs."""

    max_attempts: int
    lease_seconds: int

    def apply(self, job: NewJob) -> NewJob:
        """The job with these defaults in the fields it left out."""
        if job.max_attempts and job.lease_seconds:
            return job
        # Written out, not dataclasses.replace: that costs ~7 us, paid per job of a batch.
        return NewJob(
            job.queue,
            job.type,
            job.payload,
            job.priority,
            job.run_at,
            job.delay_seconds,
            job.max_attempts or self.max_attempts,
            job.lease_seconds or self.lease_seconds,
            job.timeout_seconds,
            job.idempotency_key,
            job.fingerprint,
            job.concurrency_key,
            job.traceparent,
            job.depends_on,
            job.on_parent_failure,
            job.ordering_key,
            job.id,
            job.workflow_id,
            job.workflow_step,
            job.has_dependents,
            job.callback_url,
            job.callback_key_id,
        )


@dataclass(frozen=True)
class ScheduleRun:
    """One run of a schedule to enqueue: the schedule, the time it is for, and its job."""

    schedule_name: str
    scheduled_for: datetime
    job: NewJob


@dataclass(frozen=True)
class OpsOutcome:
    """The answer to an ops action (cancel, retry): the job as it is now, and whether it moved."""

    job: Job
    changed: bool
    # The state the decision saw (job_cancel only), for the audit row.
    status_before: str | None = None


@dataclass(frozen=True)
class JobSearch:
    """Which jobs a listing or a bulk action covers; every field narrows it, ``None`` leaves it open."""

    queue: str | None = None
    status: JobStatus | None = None
    type: str | None = None
    # JSON containment: jobs whose payload holds this value (``payload @> this``).
    payload: Any = None
    created_after: datetime | None = None  # inclusive
    created_before: datetime | None = None  # exclusive
    # A scoped key's view: only queues matching these LIKE patterns (None: every queue).
    queue_patterns: Sequence[str] | None = None
    # These jobs only (jobs picked one by one, a failure group's jobs).
    ids: Sequence[int] | None = None
    # Jobs whose last error contains this text (case-insensitive).
    error: str | None = None
    # True: only retrying jobs (scheduled after a failure's backoff); False: none of them.
    retrying: bool | None = None

    @property
    def searches_content(self) -> bool:
        """Whether it filters by payload, time, ids or error text, which the per-queue index
        walks cannot serve."""
        return (
            self.payload is not None
            or self.created_after is not None
            or self.created_before is not None
            or self.ids is not None
            or self.error is not None
        )


@dataclass(frozen=True)
class ListFilter:
    """A search and a keyset position: a page of jobs newest first, below ``before_id``."""

    search: JobSearch = JobSearch()
    # Several states at once (a bulk action's); None: the search's own state, or every state.
    statuses: tuple[JobStatus, ...] | None = None
    before_id: int | None = None
    limit: int = 50


@dataclass(frozen=True)
class BulkOutcome:
    """What a bulk action changed, and in how many batches (each its own statement)."""

    action: BulkAction
    changed: int
    batches: int


@dataclass(frozen=True)
class BackoffPolicy:
    """How long a failed or expired attempt waits before it may run again, and what history is kept."""

    base_seconds: float
    cap_seconds: float
    errors_kept: int
    error_max_chars: int
    traceback_max_chars: int = TRACEBACK_MAX_CHARS


@dataclass(frozen=True)
class AuditFilter:
    """Filters and keyset position of an audit listing (newest first)."""

    action: str | None = None
    actor: str | None = None
    # A scoped key's view: only entries of queues matching these LIKE patterns (None: all).
    queue_patterns: tuple[str, ...] | None = None
    before_id: int | None = None
    limit: int = 50


@dataclass(frozen=True)
class Blocker:
    """One reason a job is not running: ``kind`` is queue_paused, key_limit, key_rate,
    queue_limit, queue_rate or no_worker (a due job), parents or ordering_key (a waiting one);
    ``until`` when a rate bucket refills."""

    kind: str
    message: str
    until: datetime | None = None


class DeliveryOutcome(enum.StrEnum):
    """How one webhook delivery attempt ended, as the sender judged it."""

    DELIVERED = "delivered"  # a 2xx answer
    RETRY = "retry"  # any other answer, or none: tried again after a backoff until the give-up
    FAILED = "failed"  # never to be tried again (a refused address)


@dataclass(frozen=True)
class WebhookRetryPolicy:
    """How long a webhook delivery waits between attempts, and when it is given up."""

    backoff_base_seconds: float
    backoff_cap_seconds: float
    give_up_seconds: float
