"""Structured logs: one JSON object a line (plain text on a terminal), request ids, job events.

Every record goes through the standard library's ``logging``; this module only formats it.
:class:`JsonFormatter` writes ``time`` (UTC, ISO 8601), ``level``, ``event`` (a short stable name
such as ``job.completed`` or ``auth.rejected``; the logger's name when the call gave none),
``message``, ``logger`` and then the fields the call passed as ``extra`` (``job_id``, ``queue``,
``worker_id``, ``key``, ``client``, ``reason`` ...), plus ``request_id`` while a request is
being handled. :class:`TextFormatter` writes the same as one readable line.

:class:`RequestIds` is the outermost ASGI wrapper: it takes the caller's ``X-Request-Id`` when
it is sane (1 to 64 of ``A-Z a-z 0-9 . _ -``) or makes one, holds it in :data:`request_id`
for the records logged while the request runs, and answers it in the ``X-Request-Id`` header.

:class:`JobEventLog` is an observer of the service (``services.events``): a ``job.<kind>`` info
line per committed job state change its mode keeps (:func:`log_job_events` writes them). Those
lines carry no request id: one coalesced statement carries many requests' jobs
(app/queue/coalesce.py), so the job id is what ties them together.

What a busy instance logs by default is what an operator acts on, not its traffic: a hot
request's access line and job line cost about a seventh of its CPU (docs/operating/logs.md), so
:class:`~app.http.access_log.AccessLog` (called by :class:`RequestIds`) writes an ``http.request`` line for the errors (4xx, 5xx) and the slow
requests, and :class:`JobEventLog` the changes other than the routine enqueued, claimed,
completed and webhook_delivered; ``sampled`` adds a share of the rest, ``all`` everything (the
settings ``JOBQ_LOG_ACCESS``, ``JOBQ_LOG_JOBS``). :class:`LogSummary`, a loop, writes what was
not: the requests per route and status class and the job changes per kind since its last line,
read from counters kept anyway (the request timer's histograms, a dict per job kind).
"""

from __future__ import annotations

import contextvars
import logging
import os
import re
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import IO, Any, Literal

import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.domain.types import JobEvent
from app.http.access_log import (
    ACCESS_FIELDS,
    SAMPLE_RATE_DEFAULT,
    AccessLog,
    LogMode,
    access_logger,
)
from app.http.timing import RequestDurations
from app.settings import Settings, setting_default

LogFormat = Literal["auto", "json", "text"]

REQUEST_ID_HEADER = b"x-request-id"
REQUEST_ID_MAX_CHARS = 64
_SANE_REQUEST_ID = re.compile(rb"[A-Za-z0-9._-]{1,%d}" % REQUEST_ID_MAX_CHARS)

# The id of the request being handled, for the records logged while it runs.
request_id: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "jobq_request_id", default=None
)

# What every LogRecord has; anything else on a record came from a call's ``extra`` (but
# uvicorn's ``color_message``, its message again with terminal colours).
_RECORD_ATTRIBUTES = frozenset(logging.makeLogRecord({}).__dict__) | {
    "message",
    "asctime",
    "taskName",
    "event",
    "color_message",
}

# uvicorn's access line: '%s - "%s %s HTTP/%s" %d' % (client, method, path, version, status),
# for an app served by uvicorn's own command; `jobq serve` writes its own (app/http/access_log.py).
_ACCESS_LOGGER = "uvicorn.access"
_ACCESS_FIELDS = ("client", "method", "path", "http_version", "status_code")
_JOBQ_ACCESS_LOGGER = access_logger.name

jobs_logger = logging.getLogger("jobq.jobs")
summary_logger = logging.getLogger("jobq.summary")

# The job changes every healthy job goes through: a line each is the instance's traffic, not news.
ROUTINE_JOB_KINDS = frozenset({"enqueued", "claimed", "completed", "webhook_delivered"})
# Knuth's multiplicative hash: consecutive job ids spread evenly over 32 bits.
_SPREAD = 2654435761
_SAMPLE_SCALE = 1 << 32

JOB_LOG_DEFAULT: LogMode = setting_default("log_jobs")
SUMMARY_SECONDS_DEFAULT: float = setting_default("log_summary_seconds")


_last_second: list[Any] = [None, ""]  # the last whole second formatted, and its text


def _utc(created: float) -> str:
    seconds = int(created)
    if _last_second[0] != seconds:
        _last_second[:] = [seconds, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds))]
    return f"{_last_second[1]}.{int((created - seconds) * 1000):03d}Z"


def record_fields(record: logging.LogRecord) -> tuple[str, dict[str, Any]]:
    """The event name of a record and its structured fields (``extra``, the request id), None left out."""
    event = record.__dict__.get("event")
    fields: dict[str, Any] = {}
    if isinstance(record.args, tuple):
        if record.name == _JOBQ_ACCESS_LOGGER and len(record.args) == len(ACCESS_FIELDS):
            event = event or "http.request"
            fields.update(zip(ACCESS_FIELDS, record.args, strict=True))
        elif record.name == _ACCESS_LOGGER and len(record.args) == len(_ACCESS_FIELDS):
            event = event or "http.request"
            fields.update(zip(_ACCESS_FIELDS, record.args, strict=True))
    for name, value in record.__dict__.items():
        if name not in _RECORD_ATTRIBUTES and value is not None:
            fields[name] = value
    if "request_id" not in record.__dict__ and (current := request_id.get()) is not None:
        fields["request_id"] = current
    return str(event or record.name), fields


class JsonFormatter(logging.Formatter):
    """Formats a record as one JSON object on one line: time, level, event, message, fields."""

    def format(self, record: logging.LogRecord) -> str:
        """The record as a JSON line (without the newline)."""
        event, fields = record_fields(record)
        line: dict[str, Any] = {
            "time": _utc(record.created),
            "level": record.levelname.lower(),
            "event": event,
            "message": record.getMessage(),
            "logger": record.name,
            **fields,
        }
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        return orjson.dumps(line, default=str).decode()


class TextFormatter(logging.Formatter):
    """Formats a record as a readable line: time, level, logger, message, then ``field=value``."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s %(message)s")

    def formatMessage(self, record: logging.LogRecord) -> str:
        """The line, with the event and fields after the message."""
        event, fields = record_fields(record)
        text = super().formatMessage(record)
        parts = [event] if event != record.name else []
        parts += [f"{name}={value}" for name, value in fields.items()]
        return f"{text}  [{' '.join(parts)}]" if parts else text


def formatter_for(log_format: LogFormat, stream: IO[str]) -> logging.Formatter:
    """The formatter a format asks for; ``auto``: text on a terminal, JSON otherwise."""
    if log_format == "auto":
        log_format = "text" if stream.isatty() else "json"
    return TextFormatter() if log_format == "text" else JsonFormatter()


def configure(*, level: str, log_format: LogFormat, stream: IO[str] | None = None) -> None:
    """Sends every record at ``level`` and above to ``stream`` (stderr) in ``log_format``."""
    out = stream if stream is not None else sys.stderr
    handler = logging.StreamHandler(out)
    handler.setFormatter(formatter_for(log_format, out))
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)


def log_job_events(events: Sequence[JobEvent]) -> None:
    """Observer of the service: one info line per committed job state change (``job.<kind>``)."""
    if not jobs_logger.isEnabledFor(logging.INFO):
        return
    for e in events:
        jobs_logger.info(
            "job %d %s (queue %s)",
            e.job_id,
            e.kind,
            e.queue,
            extra={
                "event": f"job.{e.kind}",
                "job_id": e.job_id,
                "queue": e.queue,
                "status": e.status,
                "worker_id": e.worker_id,
                "key_id": e.key_id,
                "attempt": e.attempt,
                "request_id": None,  # see the module's docstring
            },
        )


class JobEventLog:
    """Observer of the service: counts each job change by kind and writes those its mode keeps.

    ``errors`` keeps every kind but :data:`ROUTINE_JOB_KINDS`; ``sampled`` also keeps every
    change of a share of the jobs, chosen by job id so that a kept job's lines are all there;
    ``all`` keeps everything; ``off`` nothing. The counts feed :class:`LogSummary`.
    """

    def __init__(
        self, *, mode: LogMode = JOB_LOG_DEFAULT, sample_rate: float = SAMPLE_RATE_DEFAULT
    ) -> None:
        if not 0 <= sample_rate <= 1:
            raise ValueError("sample_rate must be within 0 and 1")
        self.mode = mode
        self.counts: dict[str, int] = {}
        self._threshold = int(sample_rate * _SAMPLE_SCALE) if mode == "sampled" else 0

    def __call__(self, events: Sequence[JobEvent]) -> None:
        """Counts the committed changes, then logs those the mode keeps."""
        counts = self.counts
        for e in events:
            counts[e.kind] = counts.get(e.kind, 0) + 1
        if self.mode == "off" or not jobs_logger.isEnabledFor(logging.INFO):
            return
        if self.mode == "all":
            log_job_events(events)
            return
        threshold = self._threshold
        kept = [
            e
            for e in events
            if e.kind not in ROUTINE_JOB_KINDS or (e.job_id * _SPREAD) % _SAMPLE_SCALE < threshold
        ]
        if kept:
            log_job_events(kept)


class LogSummary:
    """A loop: one ``summary`` line per interval, counting what had no line of its own.

    It reads counters, so a request pays next to nothing for it: the request timer's histograms
    (kept for /metrics: requests per route template, method and status class, and their
    durations), :attr:`AccessLog.slow` and :attr:`JobEventLog.counts` (a dict increment per job
    change). An interval with nothing
    to count writes nothing. :meth:`write` is the tick, also called once at shutdown.
    """

    name = "log_summary"
    leader_only = False
    batch_size = None

    def __init__(
        self,
        *,
        durations: RequestDurations,
        access: AccessLog,
        jobs: JobEventLog,
        interval_seconds: float = SUMMARY_SECONDS_DEFAULT,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not interval_seconds > 0:
            raise ValueError("interval_seconds must be > 0")
        self.durations = durations
        self.access = access
        self.jobs = jobs
        self.interval_seconds = interval_seconds
        self.clock = clock
        self._since = clock()
        self._requests: dict[tuple[str, str, str], tuple[int, float]] = {}
        self._jobs: dict[str, int] = {}
        self._slow = 0
        # The instance's name (leases carry it too), set once the app's stores know it.
        self.instance: str | None = None

    async def run_batch(self) -> int:
        """One tick: answers how many requests the line counted."""
        return self.write()

    def write(self) -> int:
        """Writes the line for what happened since the last one; answers the requests counted."""
        now = self.clock()
        seconds, self._since = now - self._since, now
        routes: dict[str, dict[str, float]] = {}
        statuses: dict[str, int] = {}
        for key, histogram in self.durations:
            count, total = sum(histogram.counts), histogram.total
            before_count, before_total = self._requests.get(key, (0, 0.0))
            if count > before_count:
                route, method, status = key
                new = count - before_count
                mean_ms = round((total - before_total) / new * 1000, 1)
                routes[f"{method} {route} {status}"] = {"count": new, "mean_ms": mean_ms}
                statuses[status] = statuses.get(status, 0) + new
            self._requests[key] = (count, total)
        jobs = {
            kind: count - self._jobs.get(kind, 0)
            for kind, count in self.jobs.counts.items()
            if count > self._jobs.get(kind, 0)
        }
        self._jobs = dict(self.jobs.counts)
        slow, self._slow = self.access.slow - self._slow, self.access.slow
        requests = sum(statuses.values())
        if not requests and not jobs:
            return 0
        summary_logger.info(
            "%d requests in %.0f s (%s), %d slow; jobs: %s",
            requests,
            seconds,
            ", ".join(f"{n} {status}" for status, n in sorted(statuses.items())) or "none",
            slow,
            ", ".join(f"{n} {kind}" for kind, n in jobs.items()) or "none",
            extra={
                "event": "summary",
                "seconds": round(seconds, 1),
                "requests": requests,
                "statuses": statuses,
                "slow_requests": slow,
                "routes": routes,
                "jobs": jobs,
                "instance": self.instance,
                "request_id": None,
            },
        )
        return requests


@dataclass(frozen=True)
class AppLogs:
    """One app's logging: the access log, the job-change observer and the summary loop."""

    access: AccessLog
    jobs: JobEventLog
    summary: LogSummary | None

    @classmethod
    def from_settings(cls, settings: Settings, *, durations: RequestDurations) -> AppLogs:
        """The logging the settings ask for, counting requests from the request timer's ``durations``."""
        access = AccessLog(
            mode=settings.log_access,
            sample_rate=settings.log_sample_rate,
            slow_ms=settings.log_slow_request_ms,
        )
        jobs = JobEventLog(mode=settings.log_jobs, sample_rate=settings.log_sample_rate)
        summary = (
            LogSummary(
                durations=durations,
                access=access,
                jobs=jobs,
                interval_seconds=settings.log_summary_seconds,
            )
            if settings.log_summary_seconds > 0
            else None
        )
        return cls(access=access, jobs=jobs, summary=summary)

    def loops(self) -> list[LogSummary]:
        """The loops the lifespan runs for the logs: the summary, unless switched off."""
        return [self.summary] if self.summary is not None else []

    def request_ids(self, app: ASGIApp) -> ASGIApp:
        """The outer wrapper for ``JobqAPI.outer``: request ids and the access log."""
        return RequestIds(app, access=self.access)


def new_request_id() -> bytes:
    """A fresh request id: 16 hex digits (64 random bits)."""
    return os.urandom(8).hex().encode()


class RequestIds:
    """ASGI wrapper: every HTTP request gets an id (the caller's when sane), in logs and the answer.

    With an :class:`AccessLog`, it also times the request and hands the log its status.
    """

    def __init__(self, app: ASGIApp, *, access: AccessLog | None = None) -> None:
        self.app = app
        self.access = access

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        value: bytes | None = None
        for name, raw in scope["headers"]:
            if name == REQUEST_ID_HEADER:
                if _SANE_REQUEST_ID.fullmatch(raw):
                    value = raw
                break
        if value is None:
            value = new_request_id()
        header = (REQUEST_ID_HEADER, value)
        status = 0

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message = {**message, "headers": [*message.get("headers", ()), header]}
            await send(message)

        access = self.access
        body: bytes | None = None
        if access is not None and access.waits_in_body(scope):
            given = receive

            async def receive_first_chunk() -> Message:
                nonlocal body
                message = await given()
                if body is None and message["type"] == "http.request":
                    body = message.get("body", b"")
                return message

            receive = receive_first_chunk

        text = value.decode("ascii")
        token = request_id.set(text)
        if access is None:
            try:
                await self.app(scope, receive, send_with_id)
            finally:
                request_id.reset(token)
            return
        start = access.clock()
        try:
            await self.app(scope, receive, send_with_id)
        finally:
            try:
                seconds = access.clock() - start
                access.answered(scope, status=status, seconds=seconds, body=body)
            finally:
                request_id.reset(token)
