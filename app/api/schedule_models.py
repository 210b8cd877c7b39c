"""Periodic jobs on the wire: the schedule a client sends (API or JOBQ_SCHEDULES file) and answers.

The request models check types and limits (strictly, as every request model here); what a
schedule means (a cron expression that parses and ever matches, a known time zone, cron or an
interval but not both) is checked by the queue core's ``Timing`` (app/domain/cron.py), and
:func:`schedule_spec` reports it under the field's name. The same models read the schedules file
(app/api/schedules_file.py), so the file has exactly the API's shape, plus each entry's name.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, Field, JsonValue, StringConstraints

from app.api.schemas import (
    CONCURRENCY_KEY_MAX_CHARS,
    LeaseSeconds,
    StrictModel,
    at_most,
    queue_name_doc,
    queue_name_rule,
)
from app.domain import records
from app.domain.bounds import MAX_ATTEMPTS_MAX, MAX_INT4, MIN_INT4, TIMEOUT_SECONDS_MAX
from app.domain.cron import (
    CRON_MAX_CHARS,
    DEFAULT_TIMEZONE,
    INTERVAL_SECONDS_MAX,
    SCHEDULE_NAME_MAX_CHARS,
    SCHEDULE_NAME_PATTERN,
    TIMEZONE_MAX_CHARS,
    JobTemplate,
    ScheduleError,
    ScheduleSpec,
    Timing,
)
from app.errors import InvalidInput
from app.settings import Settings, setting_default

SCHEDULE_NAME_DOC = (
    f"Schedule name: a letter or digit, then up to {SCHEDULE_NAME_MAX_CHARS - 1} of letters, "
    "digits, _ . : -"
)
ScheduleName = Annotated[
    str,
    StringConstraints(pattern=SCHEDULE_NAME_PATTERN.pattern),
    Field(description=SCHEDULE_NAME_DOC),
]
# Entries one schedules file may hold.
SCHEDULES_FILE_MAX_ENTRIES = 10_000

_QUEUE_MAX: int = setting_default("queue_name_max_chars")
_CRON_DOC = (
    "A cron expression: 5 fields (minute hour day-of-month month day-of-week), 6 with seconds "
    "first, or @hourly, @daily, @midnight, @weekly, @monthly, @yearly; croniter's syntax "
    "(ranges, steps, names, L, W, #), read on the clock of `timezone`. Give cron or "
    "interval_seconds."
)


class ScheduleTemplate(StrictModel):
    """The job each run enqueues, as ``POST /v1/jobs`` takes it (no run_at or idempotency key:
    each run is due at its own time, and the scheduler alone marks the job as that run)."""

    queue: Annotated[str, queue_name_rule(_QUEUE_MAX), queue_name_doc(_QUEUE_MAX)] = "default"
    type: Annotated[str, at_most(setting_default("type_max_chars"))]
    payload: JsonValue = None
    priority: int = Field(default=0, ge=MIN_INT4, le=MAX_INT4, description="Higher runs first.")
    max_attempts: int | None = Field(
        default=None, ge=1, le=MAX_ATTEMPTS_MAX, description="Unset: the service's default."
    )
    lease_seconds: LeaseSeconds | None = Field(
        default=None, description="Default lease for claims of these jobs."
    )
    timeout_seconds: int | None = Field(
        default=None, ge=1, le=TIMEOUT_SECONDS_MAX, description="Maximum run time of one attempt."
    )
    concurrency_key: Annotated[str, at_most(CONCURRENCY_KEY_MAX_CHARS)] | None = Field(
        default=None, description="The jobs' concurrency key (see POST /v1/limits)."
    )


class ScheduleRequest(StrictModel):
    """A schedule's definition: a cron expression or an interval, its zone, the job it enqueues."""

    cron: Annotated[str, StringConstraints(min_length=1, max_length=CRON_MAX_CHARS)] | None = Field(
        default=None, description=_CRON_DOC
    )
    interval_seconds: int | None = Field(
        default=None,
        ge=1,
        le=INTERVAL_SECONDS_MAX,
        description="Run every this many seconds of elapsed time (first one interval after the "
        "schedule is made). Give cron or interval_seconds.",
    )
    timezone: Annotated[str, StringConstraints(min_length=1, max_length=TIMEZONE_MAX_CHARS)] = (
        Field(
            default=DEFAULT_TIMEZONE,
            description="IANA time zone the cron expression is read in (Europe/Berlin, "
            "US/Eastern); names only a host's zoneinfo has (localtime, posix/...) and Factory "
            "are refused. Intervals ignore it.",
        )
    )
    template: ScheduleTemplate
    catch_up: int = Field(
        default=0,
        ge=0,
        le=setting_default("schedule_catch_up_max"),
        description="After downtime, how many missed runs to enqueue besides the current one "
        "(the latest ones); older missed runs are skipped.",
    )
    paused: bool | None = Field(
        default=None,
        description="Set the schedule paused or active; unset keeps its state (active when new).",
    )


class ScheduleFileEntry(ScheduleRequest):
    """One schedule of the JOBQ_SCHEDULES file: the API's definition and its name."""

    name: ScheduleName


class ScheduleFile(StrictModel):
    """The JOBQ_SCHEDULES file: ``schedules``, a list of entries (TOML ``[[schedules]]``)."""

    schedules: Sequence[ScheduleFileEntry] = Field(max_length=SCHEDULES_FILE_MAX_ENTRIES)


class ScheduleTemplateView(BaseModel):
    """The job each run enqueues."""

    queue: str
    type: str
    payload: JsonValue
    priority: int
    max_attempts: int | None
    lease_seconds: int | None
    timeout_seconds: int | None
    concurrency_key: str | None


class Schedule(BaseModel):
    """A schedule as the API shows it: its definition and what the scheduler did with it."""

    name: str
    cron: str | None
    interval_seconds: int | None
    timezone: str
    template: ScheduleTemplateView
    catch_up: int
    paused: bool
    source: Literal["api", "file"] = Field(
        description="api, or file: made by the JOBQ_SCHEDULES file (change it there)."
    )
    next_run_at: datetime = Field(
        description="The next due run. A paused schedule keeps the one it stopped at; resuming "
        "moves it to the first run after the resume."
    )
    last_run_at: datetime | None = Field(description="The latest run enqueued (its due time).")
    last_job_id: int | None = Field(description="The job of that run.")
    last_error: str | None = Field(
        description="Why the scheduler could not plan the schedule's runs (say, a time zone "
        "an instance does not know). While set the schedule enqueues nothing; a PUT or a "
        "resume clears it."
    )
    errored_at: datetime | None = Field(description="Since when last_error holds.")
    created_at: datetime
    updated_at: datetime


class SchedulePage(BaseModel):
    """A page of schedules in name order; pass ``next_cursor`` as ``after`` for the next."""

    schedules: list[Schedule]
    next_cursor: str | None


def schedule_view(row: records.Schedule) -> Schedule:
    """A schedule's row as the API shows it."""
    template = ScheduleTemplateView.model_validate(
        {name: getattr(row, name) for name in ScheduleTemplateView.model_fields}
    )
    return Schedule.model_validate(
        {
            **{name: getattr(row, name) for name in Schedule.model_fields if name != "template"},
            "template": template,
        }
    )


@dataclass(frozen=True)
class ScheduleModels:
    """The request models with one app's limits (queue names, types, catch_up)."""

    request: type[ScheduleRequest]
    file: type[ScheduleFile]


# The models with the default limits, as the subclasses below extend them.
_Template = ScheduleTemplate
_Request = ScheduleRequest
_Entry = ScheduleFileEntry
_File = ScheduleFile


def schedule_models(settings: Settings) -> ScheduleModels:
    """The schedule request models validating against these settings' limits."""
    queue_max = settings.queue_name_max_chars

    # Named as on the wire: OpenAPI names its components after these classes.
    class ScheduleTemplate(_Template):
        __doc__ = _Template.__doc__
        queue: Annotated[str, queue_name_rule(queue_max), queue_name_doc(queue_max)] = "default"
        type: Annotated[str, at_most(settings.type_max_chars)]

    class ScheduleRequest(_Request):
        __doc__ = _Request.__doc__
        template: ScheduleTemplate
        catch_up: int = Field(
            default=0,
            ge=0,
            le=settings.schedule_catch_up_max,
            description=_Request.model_fields["catch_up"].description,
        )

    class ScheduleFileEntry(ScheduleRequest, _Entry):
        __doc__ = _Entry.__doc__

    class ScheduleFile(_File):
        __doc__ = _File.__doc__
        schedules: Sequence[ScheduleFileEntry] = Field(max_length=SCHEDULES_FILE_MAX_ENTRIES)

    return ScheduleModels(request=ScheduleRequest, file=ScheduleFile)


def schedule_spec(request: ScheduleRequest) -> ScheduleSpec:
    """The queue core's view of a definition; ``ScheduleError`` names the unusable field."""
    timing = Timing(
        cron=request.cron, interval_seconds=request.interval_seconds, timezone=request.timezone
    )
    template = request.template
    return ScheduleSpec(
        timing=timing,
        template=JobTemplate(
            queue=template.queue,
            type=template.type,
            payload=template.payload,
            priority=template.priority,
            max_attempts=template.max_attempts,
            lease_seconds=template.lease_seconds,
            timeout_seconds=template.timeout_seconds,
            concurrency_key=template.concurrency_key,
        ),
        catch_up=request.catch_up,
        paused=request.paused,
    )


def request_spec(request: ScheduleRequest) -> ScheduleSpec:
    """:func:`schedule_spec` for a request body: an unusable field is a 422 naming ``body.<field>``."""
    try:
        return schedule_spec(request)
    except ScheduleError as exc:
        raise InvalidInput(
            f"invalid schedule: {exc.field}: {exc.message}",
            errors=[{"field": f"body.{exc.field}", "message": exc.message}],
        ) from None
