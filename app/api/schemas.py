"""Request and response bodies of the HTTP API (pydantic v2); unknown fields are rejected."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    StringConstraints,
    model_validator,
)

from app.queue.states import VisibleStatus

MAX_BIGINT = 2**63 - 1
MAX_INT = 2**31 - 1
TEN_YEARS_SECONDS = 10 * 366 * 24 * 3600
THIRTY_DAYS_SECONDS = 30 * 24 * 3600

QueueName = Annotated[
    str,
    StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$"),
    Field(description="Queue name: a letter or digit, then up to 127 of letters, digits, _ . : -"),
]
JobType = Annotated[str, StringConstraints(min_length=1, max_length=255)]
WorkerId = Annotated[str, StringConstraints(min_length=1, max_length=255)]
IdempotencyKey = Annotated[str, StringConstraints(min_length=1, max_length=255)]
JobId = Annotated[int, Field(ge=1, le=MAX_BIGINT)]
LeaseSeconds = Annotated[int, Field(ge=1, le=43200, description="Lease length, 1 s to 12 h.")]

MAX_CHECKPOINT_BYTES = 256 * 1024
MAX_PROGRESS_BYTES = 16 * 1024


def _json_size_at_most(limit: int) -> Callable[[Any], Any]:
    def check(value: Any) -> Any:
        if value is not None and len(json.dumps(value, separators=(",", ":"))) > limit:
            raise ValueError(f"must be at most {limit} bytes of JSON")
        return value

    return check


Checkpoint = Annotated[
    JsonValue,
    AfterValidator(_json_size_at_most(MAX_CHECKPOINT_BYTES)),
    Field(description="Any JSON, at most 256 KiB; saved under the lease check."),
]
Progress = Annotated[
    JsonValue,
    AfterValidator(_json_size_at_most(MAX_PROGRESS_BYTES)),
    Field(description='Any JSON, at most 16 KiB, e.g. {"done": 8, "total": 20}.'),
]


class StrictModel(BaseModel):
    """Base for request bodies: unknown fields are errors, not silently dropped."""

    model_config = ConfigDict(extra="forbid")


class EnqueueRequest(StrictModel):
    """One job to enqueue."""

    queue: QueueName = "default"
    type: JobType
    payload: JsonValue = None
    priority: int = Field(default=0, ge=-MAX_INT - 1, le=MAX_INT, description="Higher runs first.")
    run_at: datetime | None = Field(
        default=None, description="When the job becomes due; a time without zone is UTC."
    )
    delay_seconds: float | None = Field(
        default=None,
        ge=0,
        le=TEN_YEARS_SECONDS,
        allow_inf_nan=False,
        description="Due this many seconds after the database's now(); exclusive with run_at.",
    )
    max_attempts: int | None = Field(default=None, ge=1, le=1000)
    lease_seconds: LeaseSeconds | None = Field(
        default=None, description="Default lease for claims of this job."
    )
    idempotency_key: IdempotencyKey | None = Field(
        default=None, description="Per queue; may also come as the Idempotency-Key header."
    )
    timeout_seconds: int | None = Field(
        default=None,
        ge=1,
        le=604800,
        description="Maximum run time of one attempt; heartbeats cannot extend a lease past it, "
        "and the attempt then counts as failed.",
    )

    @model_validator(mode="after")
    def _one_schedule(self) -> EnqueueRequest:
        if self.run_at is not None and self.delay_seconds is not None:
            raise ValueError("give run_at or delay_seconds, not both")
        return self


class EnqueueBatchRequest(StrictModel):
    """Jobs to enqueue in one transaction, all or nothing."""

    jobs: list[EnqueueRequest] = Field(min_length=1, max_length=1000)


class Job(BaseModel):
    """A job as the API shows it; ``status`` is ``scheduled`` while pending with ``run_at`` ahead."""

    id: int
    queue: str
    type: str
    status: VisibleStatus
    payload: JsonValue
    priority: int
    attempts: int
    max_attempts: int
    run_at: datetime
    lease_seconds: int
    timeout_seconds: int | None
    idempotency_key: str | None
    lease_id: uuid.UUID | None
    worker_id: str | None
    lease_expires_at: datetime | None
    result: JsonValue
    last_error: str | None
    errors: list[JsonValue]
    checkpoint: JsonValue
    checkpoint_at: datetime | None
    progress: JsonValue
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    updated_at: datetime


class JobBatch(BaseModel):
    """Jobs answered in the order they were sent."""

    jobs: list[Job]


class JobPage(BaseModel):
    """One page of a job listing, newest first; pass ``next_cursor`` as ``after`` for the next."""

    jobs: list[Job]
    next_cursor: str | None


class ClaimRequest(StrictModel):
    """A worker asking for up to ``max_jobs`` leases."""

    worker_id: WorkerId
    queues: list[QueueName] = Field(min_length=1, max_length=100)
    max_jobs: int = Field(default=1, ge=1, le=100)
    lease_seconds: LeaseSeconds | None = Field(
        default=None, description="Lease for these claims; default: each job's own."
    )
    wait_seconds: float = Field(
        default=0,
        ge=0,
        le=20,
        allow_inf_nan=False,
        description="Long-poll up to this long when nothing is due.",
    )


class ClaimedJob(Job):
    """A job leased to the caller; ``attempt`` counts this try (1 on the first)."""

    attempt: int


class ClaimResponse(BaseModel):
    """The leased jobs; an empty list is a normal answer."""

    jobs: list[ClaimedJob]


class LeaseRef(StrictModel):
    """Names one lease: the job and the lease id the claim returned."""

    job_id: JobId
    lease_id: uuid.UUID


class HeartbeatItem(LeaseRef):
    """Extends one lease; ``checkpoint`` and ``progress`` (any JSON) are saved with it when present."""

    lease_seconds: LeaseSeconds | None = Field(
        default=None, description="Extend to now() + this; default: the lease the claim asked for."
    )
    checkpoint: Checkpoint = None
    progress: Progress = None


class CompleteItem(LeaseRef):
    """Completes one held job with an optional result."""

    result: JsonValue = None


class FailItem(LeaseRef):
    """Fails one attempt; retried after a backoff unless not retryable or out of attempts."""

    error: str = Field(default="", max_length=65536)
    retryable: bool = True
    retry_after_seconds: float | None = Field(
        default=None, ge=0, le=THIRTY_DAYS_SECONDS, allow_inf_nan=False
    )
    checkpoint: Checkpoint = None


class ReleaseItem(LeaseRef):
    """Gives one held job back without charging the attempt."""

    delay_seconds: float = Field(default=0, ge=0, le=THIRTY_DAYS_SECONDS, allow_inf_nan=False)
    checkpoint: Checkpoint = None


class HeartbeatRequest(StrictModel):
    """Heartbeats for every lease a worker holds, in one call."""

    worker_id: WorkerId
    leases: list[HeartbeatItem] = Field(min_length=1, max_length=1000)


class CompleteRequest(StrictModel):
    """Completions, per lease."""

    worker_id: WorkerId
    leases: list[CompleteItem] = Field(min_length=1, max_length=1000)


class FailRequest(StrictModel):
    """Failures, per lease."""

    worker_id: WorkerId
    leases: list[FailItem] = Field(min_length=1, max_length=1000)


class ReleaseRequest(StrictModel):
    """Releases, per lease."""

    worker_id: WorkerId
    leases: list[ReleaseItem] = Field(min_length=1, max_length=1000)


class LeaseResult(BaseModel):
    """The verdict for one lease: held and done (``ok``), or ``lease_lost``."""

    job_id: int
    ok: bool
    status: str | None = Field(default=None, description="The job's state after the call.")
    error: Literal["lease_lost"] | None = None
    cancelled: bool = Field(default=False, description="The job was cancelled under this lease.")
    timed_out: bool = Field(
        default=False, description="The attempt ran past the job's timeout_seconds."
    )
    lease_expires_at: datetime | None = None
    run_at: datetime | None = None


class LeaseResults(BaseModel):
    """One result per lease item, in request order."""

    results: list[LeaseResult]


class QueueStats(BaseModel):
    """Counts per state for one queue."""

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


class QueueList(BaseModel):
    """Every queue that has jobs or settings."""

    queues: list[QueueStats]


class QueueState(BaseModel):
    """A queue's switches."""

    name: str
    paused: bool


class WorkerInfo(BaseModel):
    """A worker holding leases now."""

    worker_id: str
    jobs_held: int
    job_ids: list[int]
    next_lease_expiry: datetime | None
    last_seen_at: datetime | None


class WorkerList(BaseModel):
    """Workers holding leases now."""

    workers: list[WorkerInfo]


class Health(BaseModel):
    """Liveness or readiness."""

    status: Literal["ok"]


def job_from_row(row: Any) -> dict[str, Any]:
    """Maps a jobs row (with ``db_now``) to the ``Job`` fields, deriving ``scheduled``."""
    data = {name: row[name] for name in Job.model_fields if name != "status"}
    status = row["status"]
    if status == "pending" and row["run_at"] > row["db_now"]:
        status = "scheduled"
    data["status"] = status
    return data
