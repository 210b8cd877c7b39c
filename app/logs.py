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

:func:`log_job_events` is an observer of the service (``JobService.observers``): one info line
per committed job state change. Those lines carry no request id: one coalesced statement carries
many requests' jobs (app/queue/coalesce.py), so the job id is what ties them together.
"""

from __future__ import annotations

import contextvars
import logging
import os
import re
import sys
import time
from collections.abc import Sequence
from typing import IO, Any, Literal

import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.domain.types import JobEvent

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

# uvicorn's access line: '%s - "%s %s HTTP/%s" %d' % (client, method, path, version, status).
_ACCESS_LOGGER = "uvicorn.access"
_ACCESS_FIELDS = ("client", "method", "path", "http_version", "status_code")

jobs_logger = logging.getLogger("jobq.jobs")


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
    if record.name == _ACCESS_LOGGER and isinstance(record.args, tuple) and len(record.args) == 5:
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


def new_request_id() -> bytes:
    """A fresh request id: 16 hex digits (64 random bits)."""
    return os.urandom(8).hex().encode()


class RequestIds:
    """ASGI wrapper: every HTTP request gets an id (the caller's when sane), in logs and the answer."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

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

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", ()), header]}
            await send(message)

        token = request_id.set(value.decode("ascii"))
        try:
            await self.app(scope, receive, send_with_id)
        finally:
            request_id.reset(token)
