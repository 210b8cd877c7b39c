"""Request and response bodies of the HTTP API (pydantic v2); unknown fields and loose types are errors.

Request models are strict: a number must come as a JSON number (an integer for an integer field),
text as a JSON string and a flag as ``true`` / ``false``; ``"30"``, ``1.0``, ``"true"`` or ``1`` are
errors naming the field, not guesses. Only values JSON has no type for (instants, UUIDs) are read
from strings, and an instant must carry its offset from UTC.

The request models here carry the bounds the storage holds (``app/domain/bounds.py``). Limits a
deployment may change (jobs per claim, leases per call, checkpoint size, ...) come from
``Settings``: each router subclasses these models with the values in force when the app is
built, so validation and the OpenAPI document show the same numbers.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import Header
from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    JsonValue,
    SkipValidation,
    Strict,
    StringConstraints,
    ValidationInfo,
    field_validator,
    model_validator,
)

from app.api.filters import ERROR_FILTER_MAX_CHARS, queue_name_pattern
from app.api.history_models import JOB_ID_LIST_MAX, JobIds
from app.domain.bounds import (
    DELAY_SECONDS_MAX,
    LEASE_SECONDS_MAX,
    MAX_ATTEMPTS_MAX,
    MAX_BIGINT,
    MAX_INT4,
    MIN_INT4,
    TIMEOUT_SECONDS_MAX,
    instant_in_window,
)
from app.domain.states import BulkAction, JobState, JobStatus
from app.settings import setting_default


def _in_window(value: datetime | None) -> datetime | None:
    # Checked in UTC, but the value stays as sent: the idempotency fingerprint hashes it as is.
    if value is not None:
        instant_in_window(value)
    return value


_DATE_TIME_TEXT = re.compile(r"\d{4}-\d{2}-\d{2}[Tt ]")


def _date_time_text(value: Any) -> Any:
    # Instants come as RFC 3339 text. A number (or digits in a string) would otherwise be read as
    # a Unix time, in seconds or milliseconds depending on its size: refused as ambiguous.
    if isinstance(value, datetime) or (isinstance(value, str) and _DATE_TIME_TEXT.match(value)):
        return value
    raise ValueError("must be an RFC 3339 date-time with an offset, e.g. 2030-01-01T00:00:00Z")


def queue_name_rule(max_chars: int) -> StringConstraints:
    """What a queue name at most ``max_chars`` long looks like (``JOBQ_QUEUE_NAME_MAX_CHARS``)."""
    return StringConstraints(pattern=queue_name_pattern(max_chars))


def queue_name_doc(max_chars: int) -> Any:
    """How OpenAPI describes such a queue name."""
    return Field(
        description=f"Queue name: a letter or digit, then up to {max_chars - 1} of letters, "
        "digits, _ . : -"
    )


def at_most(max_chars: int) -> StringConstraints:
    """A non-empty string at most ``max_chars`` long."""
    return StringConstraints(min_length=1, max_length=max_chars)


# The types with the default limits; routers build their models with their settings' limits.
_QUEUE_MAX: int = setting_default("queue_name_max_chars")
QueueName = Annotated[str, queue_name_rule(_QUEUE_MAX), queue_name_doc(_QUEUE_MAX)]
JobType = Annotated[str, at_most(setting_default("type_max_chars"))]
WorkerId = Annotated[str, at_most(setting_default("worker_id_max_chars"))]
IdempotencyKey = Annotated[str, at_most(setting_default("idempotency_key_max_chars"))]
CONCURRENCY_KEY_MAX_CHARS = 255
ConcurrencyKey = Annotated[str, at_most(CONCURRENCY_KEY_MAX_CHARS)]
JobId = Annotated[int, Field(ge=1, le=MAX_BIGINT)]
LeaseSeconds = Annotated[
    int, Field(ge=1, le=LEASE_SECONDS_MAX, description=f"Lease length, 1 to {LEASE_SECONDS_MAX} s.")
]
Instant = Annotated[
    AwareDatetime,
    Strict(False),  # JSON has no instant type: read from text
    BeforeValidator(_date_time_text),
    AfterValidator(_in_window),
    Field(
        description="An RFC 3339 date-time with its offset (2030-01-01T09:00:00Z, "
        "2030-01-01T10:00:00+01:00) from 1970-01-01T00:00:00Z up to (not including) "
        "9000-01-01T00:00:00Z, checked in UTC; a time without offset is refused."
    ),
]
LeaseId = Annotated[uuid.UUID, Strict(False)]  # JSON has no UUID type: read from text
# A value of a request's body, which the strict parser (app/http/strict_json.py) has read as
# JSON and checked for what jsonb refuses. Validated again as JsonValue, it was walked once
# more in Python: 0.8 of the 2.2 ms a batch of 500 small payloads took to validate.
BodyJson = Annotated[JsonValue, SkipValidation]


def json_size_at_most(limit: int) -> Callable[[Any], Any]:
    """A validator refusing JSON values longer than ``limit`` bytes once encoded."""

    def check(value: Any) -> Any:
        if value is not None and len(json.dumps(value, separators=(",", ":"))) > limit:
            raise ValueError(f"must be at most {limit} bytes of JSON")
        return value

    return check


class StrictModel(BaseModel):
    """Base for request bodies: unknown fields and values of the wrong JSON type are errors.

    Strict mode holds for every field, also in subclasses; a float field takes JSON integers.
    """

    model_config = ConfigDict(extra="forbid", strict=True)


class JobTemplate(StrictModel):
    """The fields of a job that every way of making one shares: ``POST /v1/jobs``, a batch's
    jobs and its callback, a workflow's steps. (``app/api/job_models.py`` binds their limits to a
    deployment's settings, in one place for all of them.)"""

    queue: QueueName = "default"
    type: JobType
    payload: BodyJson = None
    priority: int = Field(default=0, ge=MIN_INT4, le=MAX_INT4, description="Higher runs first.")
    run_at: Instant | None = Field(default=None, description="When the job becomes due.")
    delay_seconds: float | None = Field(
        default=None,
        ge=0,
        le=DELAY_SECONDS_MAX,
        allow_inf_nan=False,
        description="Due this many seconds after the database's now(); exclusive with run_at.",
    )
    max_attempts: int | None = Field(default=None, ge=1, le=MAX_ATTEMPTS_MAX)
    lease_seconds: LeaseSeconds | None = Field(
        default=None, description="Default lease for claims of this job."
    )
    timeout_seconds: int | None = Field(
        default=None,
        ge=1,
        le=TIMEOUT_SECONDS_MAX,
        description="Maximum run time of one attempt: no lease reaches past it, and a heartbeat, "
        "complete, fail or release after it answers timed_out; the attempt counts as failed.",
    )
    concurrency_key: ConcurrencyKey | None = Field(
        default=None,
        description="Groups jobs for the limits of POST /v1/limits (e.g. customer:42): a claim "
        "never runs more of a key's jobs at once than its max_running, nor claims them faster "
        "than its rate. Without a matching limit the key only labels the job.",
    )
    callback_url: str | None = Field(
        default=None,
        max_length=setting_default("webhook_url_max_chars"),
        description="Where jobq POSTs the job's outcome, signed, once it finishes (succeeded, "
        "dead or cancelled): an absolute http(s) URL; default: the queue's callback_url. "
        "See docs/guides/webhooks.md.",
    )
    on_parent_failure: Literal["cancel", "run"] | None = Field(
        default=None,
        description="When a job it waits for ends dead or cancelled: cancel this one too (the "
        "default, recorded in its history), or run it anyway.",
    )

    @model_validator(mode="after")
    def _one_schedule(self) -> JobTemplate:
        if self.run_at is not None and self.delay_seconds is not None:
            raise ValueError("give run_at or delay_seconds, not both")
        return self


class EnqueueRequest(JobTemplate):
    """One job to enqueue."""

    idempotency_key: IdempotencyKey | None = Field(
        default=None,
        description="Per queue; may also come as the Idempotency-Key header. Remembered as long "
        "as its job is kept: once the pruner deletes the job, the key may be used again.",
    )
    depends_on: list[JobId] | None = Field(
        default=None,
        min_length=1,
        max_length=setting_default("depends_on_max"),
        description="Jobs this one waits for: it stays waiting (never claimed) until every one "
        "has ended as on_parent_failure asks, then becomes due in the same transaction as the "
        "last one's end. Its claim carries their states and results (parents).",
    )
    ordering_key: ConcurrencyKey | None = Field(
        default=None,
        description="Jobs of a queue with the same ordering key run one at a time, in enqueue "
        "order, across all instances: the next starts once the one before succeeded, or ended "
        "dead or cancelled (a retrying job holds the ones after it). Other keys are never held "
        "up. Not with depends_on.",
    )

    @model_validator(mode="after")
    def _links(self) -> EnqueueRequest:
        if self.ordering_key is not None and self.depends_on is not None:
            raise ValueError("give depends_on or ordering_key, not both")
        if self.on_parent_failure is not None and self.depends_on is None:
            raise ValueError("on_parent_failure needs depends_on")
        return self


class BatchCallback(EnqueueRequest):
    """A job enqueued with a batch, waiting for every job of it: due once all succeeded
    (``when: all_succeeded``; cancelled if one ends dead or cancelled) or all finished
    (``all_finished``). Its claim carries the counts per outcome and the failed jobs' ids.
    It takes no depends_on, on_parent_failure or ordering_key (its batch is what it waits for)."""

    when: Literal["all_succeeded", "all_finished"] = "all_succeeded"

    @field_validator("depends_on", "on_parent_failure", "ordering_key")
    @classmethod
    def _waits_for_its_batch(cls, value: object, info: ValidationInfo) -> object:
        # An ordering key would make it due when its key's previous job ends, before its batch.
        if value is not None:
            raise ValueError(f"a callback waits for its batch: it takes no {info.field_name}")
        return value


class EnqueueBatchRequest(StrictModel):
    """Jobs to enqueue in one transaction, all or nothing."""

    jobs: Sequence[EnqueueRequest] = Field(min_length=1)
    callback: BatchCallback | None = Field(
        default=None,
        description="A job enqueued with the batch, waiting for all of it; answered last.",
    )


class Job(BaseModel):
    """A job as the API shows it."""

    id: int
    queue: str
    type: str
    status: JobStatus
    retrying: bool = Field(
        description="Scheduled to run again after a failed attempt's (or an expired lease's) "
        "backoff, as opposed to scheduled for later."
    )
    payload: JsonValue
    priority: int
    attempts: int
    max_attempts: int
    run_at: datetime
    lease_seconds: int
    timeout_seconds: int | None
    idempotency_key: str | None
    concurrency_key: str | None
    lease_id: uuid.UUID | None
    worker_id: str | None
    lease_expires_at: datetime | None
    result: JsonValue
    last_error: str | None
    errors: list[JsonValue]
    checkpoint: JsonValue
    checkpoint_at: datetime | None
    progress: JsonValue
    progress_at: datetime | None = Field(
        description="When a heartbeat last moved the progress or the checkpoint."
    )
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    updated_at: datetime
    traceparent: str | None = Field(
        description="The W3C trace context the job was enqueued in (its enqueue span's when "
        "the service traces): a worker continues the trace from it."
    )
    depends_on: list[int] | None = Field(
        default=None, description="The jobs this one waits for (waiting until they end)."
    )
    on_parent_failure: Literal["cancel", "run"] | None = Field(
        default=None, description="What a parent ending dead or cancelled does (null: cancel)."
    )
    ordering_key: str | None = Field(
        default=None, description="Its queue's jobs with this key run one at a time, in order."
    )
    workflow_id: int | None = Field(default=None, description="The workflow it is a step of.")
    workflow_step: str | None = Field(default=None, description="Its step's name there.")
    callback_url: str | None = Field(
        default=None, description="Where the outcome is POSTed when the job finishes."
    )
    stored_json_errors: dict[str, str] | None = Field(
        default=None,
        description="Only on a job whose stored JSON no reader can take (written by an older "
        "version or by hand, past the checks of the API and jobq.enqueue()): each such field "
        "(payload, result, checkpoint, progress, errors) shows as null, and this says why. "
        "Claiming such a job fails it at once, with this reason.",
    )


TraceParent = Annotated[
    str | None,
    Header(
        alias="traceparent",
        description="W3C trace context (00-<trace id>-<span id>-<flags>): kept with the jobs "
        "(enqueue) or the parent of the service's span (claim, lease calls). An invalid value "
        "is ignored, as the W3C recommendation asks.",
    ),
]


class JobBatch(BaseModel):
    """Jobs answered in the order they were sent."""

    jobs: list[Job]
    callback: Job | None = Field(
        default=None, description="The batch's callback job, when the batch named one."
    )


class BatchIds(BaseModel):
    """A batch's lean answer (``?answer=ids``): the jobs' ids in the order they were sent."""

    ids: list[int]
    created: list[bool] = Field(
        description="Per job, whether this call created it (false: its idempotency key's job "
        "already existed and is answered as it is)."
    )
    callback_id: int | None = Field(
        default=None, description="The batch's callback job's id, when the batch named one."
    )


class JobPage(BaseModel):
    """One page of a job listing, newest first; pass ``next_cursor`` as ``after`` for the next."""

    jobs: list[Job]
    next_cursor: str | None


class BulkRequest(StrictModel):
    """Which jobs a bulk action covers; every field given narrows it (none: every job the action
    may touch). Bulk retry takes dead jobs unless ``status`` names cancelled or succeeded ones;
    bulk cancel takes scheduled and pending ones (a running job is cancelled by id); bulk delete
    takes finished ones."""

    queue: QueueName | None = None
    # Strict(False): JSON has no enum type, the state comes as text (strict mode would refuse
    # every string, as it did before issue 20).
    status: Annotated[JobState, Strict(False)] | None = Field(
        default=None, description="A state, or retrying (scheduled after a failure's backoff)."
    )
    type: JobType | None = None
    payload: JsonValue = Field(
        default=None,
        description='Jobs whose payload contains this JSON value (jsonb @>), e.g. {"user": 42}.',
    )
    created_after: Instant | None = Field(default=None, description="Created at or after.")
    created_before: Instant | None = Field(default=None, description="Created before.")
    error: str | None = Field(
        default=None,
        min_length=1,
        max_length=ERROR_FILTER_MAX_CHARS,
        description="Jobs whose last error contains this text (case-insensitive).",
    )
    ids: JobIds | None = Field(
        default=None,
        min_length=1,
        max_length=JOB_ID_LIST_MAX,
        description="These jobs only (picked one by one, or a failure group's).",
    )
    dry_run: bool = Field(
        default=False, description="Count the jobs the action would change, and change none."
    )


class BulkResult(BaseModel):
    """What a bulk action changed."""

    action: BulkAction
    dry_run: bool
    changed: int = Field(
        description="Jobs changed (with dry_run: jobs the action would change now, exactly)."
    )
    batches: int = Field(description="Statements it ran, each committed on its own.")


class MinuteOutcomes(BaseModel):
    """A queue's outcomes in one minute: attempts that succeeded, failed (to be retried), went
    dead, or jobs cancelled."""

    minute: datetime
    succeeded: int = 0
    failed: int = 0
    dead: int = 0
    cancelled: int = 0


class QueueStats(BaseModel):
    """Counts per state for one queue."""

    name: str
    paused: bool
    scheduled: int
    retrying: int = Field(
        default=0, description="Of the scheduled jobs, those waiting out a retry's backoff."
    )
    pending: int
    running: int
    succeeded: int
    dead: int
    cancelled: int
    waiting: int = Field(
        default=0,
        description="Waiting for other jobs: their parents (depends_on) or the earlier jobs of "
        "their ordering key.",
    )
    oldest_pending_age_seconds: float | None
    succeeded_last_minute: int = Field(
        description="Jobs that succeeded in the last 60 s, estimated from per-minute counts."
    )
    last_hour: list[MinuteOutcomes] = Field(
        default_factory=list,
        description="Outcomes per minute over the last hour, oldest first; minutes with none "
        "are left out.",
    )
    callback_url: str | None = Field(
        default=None, description="The default callback of the queue's jobs that name none."
    )


class QueueList(BaseModel):
    """Every queue that has jobs or settings."""

    queues: list[QueueStats]


class QueueState(BaseModel):
    """A queue's switches."""

    name: str
    paused: bool
    callback_url: str | None = Field(
        default=None, description="The default callback of the queue's jobs that name none."
    )


class QueueSettings(StrictModel):
    """A queue's switches as ``PUT /v1/queues/{name}`` sets them."""

    paused: bool | None = Field(
        default=None,
        description="Set the queue paused or active; unset keeps its state (active when new).",
    )
    callback_url: str | None = Field(
        default=None,
        max_length=setting_default("webhook_url_max_chars"),
        description="Default callback_url of the queue's jobs that name none (signed with the "
        "enqueuing key's secret); unset keeps it, null clears it.",
    )


class WorkerInfo(BaseModel):
    """A worker seen claiming in the last ten minutes, or holding leases now."""

    worker_id: str
    key_name: str | None = Field(
        default=None, description="The API key the worker claimed with (none without keys)."
    )
    queues: list[str] = Field(
        default_factory=list, description="The queues it asked for in its last claim."
    )
    live: bool = Field(
        default=True,
        description="Seen claiming (a long-poll included) or heartbeating in the last 60 s.",
    )
    instance: str | None = Field(
        default=None,
        description="The jobq instance(s) that granted its leases, or that saw its last claim "
        "(JOBQ_INSTANCE_NAME, or <hostname>:<pid>).",
    )
    first_seen_at: datetime | None = Field(
        default=None, description="Its first claim this jobq remembers (kept a day after its last)."
    )
    jobs_held: int
    job_ids: list[int]
    job_types: list[str] = Field(default_factory=list, description="In job_ids' order.")
    job_started_at: list[datetime] = Field(
        default_factory=list, description="When each held job's attempt started, in job_ids' order."
    )
    lease_expiries: list[datetime] = Field(
        default_factory=list, description="Each held job's lease expiry, in job_ids' order."
    )
    next_lease_expiry: datetime | None
    last_seen_at: datetime | None = Field(
        description="Its last claim, or heartbeat on a job it still holds."
    )


class WorkerList(BaseModel):
    """Workers holding leases now."""

    workers: list[WorkerInfo]


class Health(BaseModel):
    """Liveness or readiness."""

    status: Literal["ok"]
