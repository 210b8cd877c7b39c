"""Bodies of a job's history, of failures grouped by cause, and of a failure's structured error."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    StringConstraints,
    ValidationError,
    ValidatorFunctionWrapHandler,
    WrapValidator,
)
from pydantic_core import PydanticCustomError

from app.domain.bounds import ERROR_TYPE_MAX_CHARS, MAX_BIGINT, TRACEBACK_MAX_CHARS

# A failure group's fingerprint: of a traceback's frames (t:) or of a masked message (m:).
FINGERPRINT_PATTERN = "^[tm]:[0-9a-f]{32}$"

EVENT_KINDS = Literal[
    "enqueued",
    "claimed",
    "progress",
    "released",
    "failed",
    "lease_expired",
    "timed_out",
    "completed",
    "promoted",
    "cancelled",
    "retried",
    "run_now",
    "webhook",
    "ready",
]


class ErrorDetail(BaseModel):
    """A failure's error as the worker's language knows it: the exception's type name, its
    message and its traceback. The job keeps ``"{type}: {message}"`` as its ``last_error``; the
    traceback is kept in the job's history only (``GET /v1/jobs/{id}/events``)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    type: Annotated[str, StringConstraints(min_length=1, max_length=ERROR_TYPE_MAX_CHARS)] = Field(
        description=f"The exception's type, e.g. KeyError (at most {ERROR_TYPE_MAX_CHARS} chars)."
    )
    message: str = Field(
        default="",
        description="The exception's message; cut to the service's error_text_max_chars.",
    )
    traceback: str | None = Field(
        default=None,
        description=f"The traceback as text; only its last {TRACEBACK_MAX_CHARS} characters are "
        "kept (the exception line is the last).",
    )


def _one_error(value: object, handler: ValidatorFunctionWrapHandler) -> object:
    """A fail item's ``error``: text, or an :class:`ErrorDetail`. A problem is reported at the
    ``error`` field itself, naming the detail's part, not at a member of the union."""
    if isinstance(value, str | ErrorDetail):
        return value
    if isinstance(value, dict):
        try:
            return ErrorDetail.model_validate(value)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(part) for part in e['loc'])}: {e['msg']}" for e in exc.errors()
            )
            raise PydanticCustomError(
                "error_detail", "{problems}", {"problems": problems}
            ) from None
    raise PydanticCustomError(
        "error_kind", "must be text, or an object with type, message and traceback"
    )


# What POST /v1/fail takes as a lease's error.
FailError = Annotated[str | ErrorDetail, WrapValidator(_one_error)]


class JobEvent(BaseModel):
    """One event of a job's history.

    ``actor`` is the worker id for a worker's events (claimed, progress, released, failed), the
    acting key's name (as in the audit trail) for an operator's (cancelled, retried, run_now),
    and null for the service's own (enqueued, promoted, lease_expired, timed_out). ``data``
    holds the kind's details: the error with its type and traceback for failed, the checkpoint
    saved and delay for released, the progress for progress, the state before for an
    operator's action, the next run for failures and expiries, and for webhook one delivery
    attempt: its delivery id and attempt, url, outcome (delivered, retrying, failed), status
    code or error and next attempt.
    """

    id: int = Field(description="0 for events read from the job's own columns.")
    at: datetime
    kind: EVENT_KINDS
    attempt: int | None
    actor: str | None
    key_name: str | None = Field(description="The API key of the worker or operator, if any.")
    instance: str | None = Field(description="The jobq instance that granted a claim.")
    data: JsonValue


class JobEventPage(BaseModel):
    """A page of a job's history, oldest first; pass ``next_cursor`` as ``after`` for the next."""

    events: list[JobEvent]
    next_cursor: str | None


class FailureGroup(BaseModel):
    """Recent failures of one cause."""

    queue: str
    type: str
    error_type: str = Field(
        description="The error's type as the worker sent it; lease_expired or timed_out for "
        "attempts the service ended, the failure's kind for an error sent as plain text."
    )
    fingerprint: str = Field(
        description="What the group is, within its queue, job type and error type: ``t:`` and a "
        "hash of the traceback's frames (file and function, no line numbers) for failures sent "
        "with a traceback, else ``m:`` and a hash of ``pattern``. With queue, type and "
        "error_type, the key POST /v1/failures/{action} takes."
    )
    grouped_by: Literal["traceback", "message"] = Field(
        description="traceback: by error type and the traceback's frames, whatever the messages "
        "say; message: by error type and the masked message."
    )
    pattern: str = Field(
        description="The message with quoted values, e-mail addresses, query strings and every "
        "token holding a digit masked (<n> a number, <id> any other token); for a traceback "
        "group, its newest failure's."
    )
    culprit: str | None = Field(
        description="Where the newest failure was raised, from its traceback: the innermost frame "
        "of the application's own code, as ``file in function``; null without a traceback."
    )
    failures: int = Field(description="Failed attempts in the window.")
    failures_last_hour: int
    jobs: int = Field(description="Distinct jobs among them.")
    dead_jobs: int = Field(description="Of those jobs, how many are dead now.")
    first_seen_at: datetime
    last_seen_at: datetime
    last_message: str = Field(description="The newest failure's message, unmasked.")
    sample_job_ids: list[int]


class FailureList(BaseModel):
    """Failures grouped by cause, largest group first."""

    since: datetime
    groups: list[FailureGroup]
    scanned: int = Field(description="Failures read, the newest first.")
    truncated: bool = Field(
        description="The window held more failures than one grouping reads; older ones are left "
        "out."
    )


class FailureGroupAction(BaseModel):
    """One failure group (as ``GET /v1/failures`` names it) to retry or cancel."""

    model_config = ConfigDict(extra="forbid", strict=True)

    queue: str = Field(min_length=1, max_length=1000)
    type: str = Field(min_length=1, max_length=10_000)
    error_type: str = Field(min_length=1, max_length=ERROR_TYPE_MAX_CHARS)
    fingerprint: str = Field(
        pattern=FINGERPRINT_PATTERN,
        description="The group's fingerprint, as GET /v1/failures has it.",
    )
    window_seconds: float = Field(default=86_400, gt=0, le=30 * 86_400, allow_inf_nan=False)
    dry_run: bool = Field(
        default=False, description="Count the jobs the action would change, and change none."
    )


JOB_ID_LIST_MAX = 10_000
JobIds = list[Annotated[int, Field(ge=1, le=MAX_BIGINT)]]


class Blocker(BaseModel):
    """One reason a pending or waiting job is not running."""

    kind: Literal[
        "queue_paused",
        "key_limit",
        "key_rate",
        "queue_limit",
        "queue_rate",
        "no_worker",
        "parents",
        "ordering_key",
    ]
    message: str = Field(description='In words, e.g. "key customer:42 at 2/2".')
    until: datetime | None = Field(description="When an empty rate bucket has a token again.")


class JobBlockers(BaseModel):
    """What holds a job back now: empty unless it is pending or waiting."""

    job_id: int
    status: str
    blockers: list[Blocker]
