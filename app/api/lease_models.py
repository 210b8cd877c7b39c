"""Wire models of the worker routes: claim, and the lease calls (heartbeat, complete, fail,
release) with their verdicts. Strict as every request model (app/api/schemas.py says how); the
routers subclass them with the limits in force."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field, JsonValue

from app.api.history_models import FailError
from app.api.schemas import (
    BodyJson,
    Job,
    JobId,
    LeaseId,
    LeaseSeconds,
    QueueName,
    StrictModel,
    WorkerId,
)
from app.domain.bounds import RETRY_DELAY_SECONDS_MAX
from app.domain.states import JobStatus
from app.settings import setting_default


class ClaimNext(StrictModel):
    """What to claim: POST /v1/claim's fields but ``worker_id``, for a complete, fail or release
    that takes the worker's next jobs in the same call (its leases go to that call's worker)."""

    queues: list[QueueName] = Field(min_length=1, max_length=setting_default("claim_max_queues"))
    max_jobs: int = Field(default=1, ge=1)
    lease_seconds: LeaseSeconds | None = Field(
        default=None, description="Lease for these claims; default: each job's own."
    )
    wait_seconds: float = Field(
        default=0,
        ge=0,
        allow_inf_nan=False,
        description="Long-poll up to this long when nothing is due.",
    )


class _Claimant(StrictModel):
    """Who claims: the worker, named as its lease calls will name it."""

    worker_id: WorkerId


# The claimant first: worker_id leads the claim's fields, as it always did.
class ClaimRequest(ClaimNext, _Claimant):
    """A worker asking for up to ``max_jobs`` leases."""


class ParentJob(BaseModel):
    """One job a claimed job waited for: how it ended, and its result.

    A claim carries the results only of parents whose queue the claiming key may read; of the
    others it carries the id and state (``result: null``, ``step: null``,
    ``result_hidden: true``), as ``GET /v1/jobs/{id}`` answers such a parent 403."""

    id: int
    step: str | None = Field(
        description="Its workflow step's name, if any (null when result_hidden)."
    )
    status: str = Field(description="succeeded, dead or cancelled; deleted when it is gone.")
    result: JsonValue = Field(
        description="Its result, unless result_by_reference or result_hidden (then null)."
    )
    result_by_reference: bool = Field(
        description="The result did not fit the claim (JOBQ_PARENT_RESULT_INLINE_MAX_BYTES each, "
        "JOBQ_PARENT_RESULTS_MAX_BYTES for the results inline in all, in depends_on order): "
        "read it with GET /v1/jobs/{id}."
    )
    result_hidden: bool = Field(
        default=False,
        description="Its queue is outside the claiming key's scopes: the claim tells only its "
        "id and state, and GET /v1/jobs/{id} answers 403.",
    )


class Parents(BaseModel):
    """What a job that waited for others learns of them when claimed."""

    total: int
    succeeded: int
    dead: int
    cancelled: int
    failed_ids: list[int] = Field(description="The parents that ended dead, cancelled or gone.")
    jobs: list[ParentJob] = Field(description="Every parent, in depends_on order.")


class ClaimedJob(Job):
    """A job leased to the caller; ``attempt`` counts this try (1 on the first)."""

    attempt: int
    parents: Parents | None = Field(
        default=None, description="For a job that waited for others (depends_on): how they ended."
    )


class ClaimResponse(BaseModel):
    """The leased jobs; an empty list is a normal answer."""

    jobs: list[ClaimedJob]


class LeaseRef(StrictModel):
    """Names one lease: the job and the lease id the claim returned."""

    job_id: JobId
    lease_id: LeaseId


class HeartbeatItem(LeaseRef):
    """Extends one lease; ``checkpoint`` and ``progress`` (any JSON) are saved with it when present."""

    lease_seconds: LeaseSeconds | None = Field(
        default=None, description="Extend to now() + this; default: the lease the claim asked for."
    )
    checkpoint: JsonValue = None
    progress: JsonValue = None


class CompleteItem(LeaseRef):
    """Completes one held job with an optional result."""

    result: BodyJson = None


class FailItem(LeaseRef):
    """Fails one attempt; retried after a backoff unless not retryable or out of attempts."""

    error: FailError = Field(
        default="",
        description="What went wrong: text (kept cut to the service's error_text_max_chars), or "
        "the exception's type, message and traceback.",
    )
    retryable: bool = True
    retry_after_seconds: float | None = Field(
        default=None,
        ge=0,
        le=RETRY_DELAY_SECONDS_MAX,
        allow_inf_nan=False,
        description="Retry after exactly this long (0: at once) instead of the backoff.",
    )
    checkpoint: JsonValue = None


class ReleaseItem(LeaseRef):
    """Gives one held job back without charging the attempt."""

    delay_seconds: float = Field(default=0, ge=0, le=RETRY_DELAY_SECONDS_MAX, allow_inf_nan=False)
    checkpoint: JsonValue = None


class HeartbeatRequest(StrictModel):
    """Heartbeats for every lease a worker holds, in one call."""

    worker_id: WorkerId
    leases: Sequence[HeartbeatItem] = Field(min_length=1)


class CompleteRequest(StrictModel):
    """Completions, per lease."""

    worker_id: WorkerId
    leases: Sequence[CompleteItem] = Field(min_length=1)
    claim_next: ClaimNext | None = Field(
        default=None,
        description="Then claim the worker's next jobs in the same call (see SettleResults).",
    )


class FailRequest(StrictModel):
    """Failures, per lease."""

    worker_id: WorkerId
    leases: Sequence[FailItem] = Field(min_length=1)
    claim_next: ClaimNext | None = Field(
        default=None,
        description="Then claim the worker's next jobs in the same call (see SettleResults).",
    )


class ReleaseRequest(StrictModel):
    """Releases, per lease."""

    worker_id: WorkerId
    leases: Sequence[ReleaseItem] = Field(min_length=1)
    claim_next: ClaimNext | None = Field(
        default=None,
        description="Then claim the worker's next jobs in the same call (see SettleResults).",
    )


class LeaseResult(BaseModel):
    """The verdict for one lease: held and done (``ok``), or ``lease_lost``.

    A call repeated with the same lease answers ``ok`` only when it is the same transition that
    ended the lease (a second complete after a complete); any other call after the lease ended
    answers ``lease_lost``.
    """

    job_id: int
    ok: bool
    status: JobStatus | None = Field(default=None, description="The job's state after the call.")
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


class Problem(BaseModel):
    """An RFC 9457 problem, as every error answer's body carries it."""

    type: str
    title: str
    status: int
    detail: str
    errors: list[dict[str, JsonValue]] | None = Field(
        default=None, description="The fields at fault, when there are any."
    )


class SettleResults(LeaseResults):
    """One result per lease item, in request order; with ``claim_next``, the claim made after them.

    The claim runs once the transition is done, for the same worker and key, whatever the
    verdicts (a lost lease frees the worker's slot as well): in the same statement and commit
    as the transition (shared with concurrent calls'), and once more after the commit when it
    came back short while the transition made jobs claimable that it could not see (a job
    released, or failed with retry_after_seconds 0; slots a limit freed), or as a long-poll
    when nothing was due and wait_seconds allows.
    """

    claimed: ClaimResponse | None = Field(
        default=None,
        description="With claim_next: what POST /v1/claim would have answered, the jobs now "
        "leased to the same worker (none when nothing was due, or the claim failed); absent "
        "without claim_next.",
    )
    claim_error: Problem | None = Field(
        default=None,
        description="With claim_next: the problem POST /v1/claim would have answered, when the "
        "claim failed after the transition committed (the results stand); absent otherwise.",
    )
