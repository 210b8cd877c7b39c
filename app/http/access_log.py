"""Which answered requests get an ``http.request`` line: the errors, the slow ones, a sample.

A hot request's access line and job line cost about a seventh of its CPU (docs/operating/logs.md), so
by default a busy instance writes an access line only for what an operator acts on: a 4xx or
5xx answer, or a request slower than ``JOBQ_LOG_SLOW_REQUEST_MS``. :class:`AccessLog` decides
and writes; the request id wrapper (app/logs.py, ``RequestIds``) times each request and hands
it the status. What gets no line is still counted, by the request timer (app/http/timing.py),
for the summary line (app/logs.py, ``LogSummary``).
"""

from __future__ import annotations

import logging
import random
import re
import time
from collections.abc import Callable
from typing import Literal
from urllib.parse import quote

from starlette.types import Scope

from app.settings import setting_default

# Which requests or job changes get a line of their own (the settings log_access and log_jobs).
LogMode = Literal["off", "errors", "sampled", "all"]

ACCESS_LOG_DEFAULT: LogMode = setting_default("log_access")
SAMPLE_RATE_DEFAULT: float = setting_default("log_sample_rate")
SLOW_REQUEST_MS_DEFAULT: float = setting_default("log_slow_request_ms")

access_logger = logging.getLogger("jobq.access")
# The line, and the fields of an ``http.request`` record in the order of its arguments.
ACCESS_FORMAT = '%s - "%s %s HTTP/%s" %d in %.1f ms'
ACCESS_FIELDS = ("client", "method", "path", "http_version", "status_code", "duration_ms")
_SLOW = {"slow": True}

# The requests that may ask to wait in their JSON body (``wait_seconds``, or a settle's
# ``claim_next.wait_seconds``); any may in its query.
_WAITING_BODIES = frozenset(
    {("POST", "/v1/claim"), ("POST", "/v1/complete"), ("POST", "/v1/fail"), ("POST", "/v1/release")}
)
_WAIT_IN_BODY = re.compile(rb'"wait_seconds"\s*:\s*([0-9]+(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?)')
_WAIT_IN_QUERY = re.compile(rb"(?:^|&)wait_seconds=([0-9]+(?:\.[0-9]*)?)")


class AccessLog:
    """Decides which answered requests get an ``http.request`` line, and writes it.

    Every mode but ``off`` logs the errors (status 400 and above) and the slow requests; a
    request that asked to wait (``wait_seconds``, a long poll) is slow only this long past its
    wait. ``sampled`` adds a random share of the others, ``all`` every one. A line is a warning
    for a 5xx or a slow request, info otherwise. ``slow`` counts the slow requests in every mode.
    """

    def __init__(
        self,
        *,
        mode: LogMode = ACCESS_LOG_DEFAULT,
        sample_rate: float = SAMPLE_RATE_DEFAULT,
        slow_ms: float = SLOW_REQUEST_MS_DEFAULT,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        if not 0 <= sample_rate <= 1 or not slow_ms > 0:
            raise ValueError("sample_rate must be within 0 and 1, slow_ms above 0")
        self.mode = mode
        self.clock = clock
        self.slow_seconds = slow_ms / 1000
        self.slow = 0
        self._on = mode != "off"
        self._every = mode == "all"
        self._share = sample_rate if mode == "sampled" else 0.0

    def waits_in_body(self, scope: Scope) -> bool:
        """Whether the request may ask to wait in its body: the first chunk is kept to see."""
        return (scope["method"], scope["path"]) in _WAITING_BODIES

    def answered(self, scope: Scope, *, status: int, seconds: float, body: bytes | None) -> None:
        """Counts a slow request and writes the line the mode asks for (none if unanswered)."""
        slow = seconds > self.slow_seconds and seconds > self.slow_seconds + _asked_wait(
            scope, body
        )
        if slow:
            self.slow += 1
        if not status or not self._on:
            return
        if status >= 400 or slow or self._every or (self._share and random.random() < self._share):
            self._write(scope, status=status, seconds=seconds, slow=slow)

    def _write(self, scope: Scope, *, status: int, seconds: float, slow: bool) -> None:
        level = logging.WARNING if status >= 500 or slow else logging.INFO
        if not access_logger.isEnabledFor(level):
            return
        client = scope.get("client")
        path = quote(scope.get("root_path", "") + scope["path"])
        if query := scope.get("query_string"):
            path = f"{path}?{query.decode('ascii', 'replace')}"
        # Its fields are read from these arguments when the line is formatted (ACCESS_FIELDS):
        # cheaper than ``extra``, which the logging module copies onto every record.
        access_logger.log(
            level,
            ACCESS_FORMAT,
            f"{client[0]}:{client[1]}" if client else "-",
            scope["method"],
            path,
            scope.get("http_version", "1.1"),
            status,
            round(seconds * 1000, 1),
            extra=_SLOW if slow else None,
        )


def _asked_wait(scope: Scope, body: bytes | None) -> float:
    """The ``wait_seconds`` a request asked for, in its JSON body or query string (0: none)."""
    found = _WAIT_IN_BODY.search(body) if body else None
    if found is None and (query := scope.get("query_string")):
        found = _WAIT_IN_QUERY.search(query)
    return float(found.group(1)) if found is not None else 0.0
