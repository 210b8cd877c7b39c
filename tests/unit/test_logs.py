"""Log lines: JSON with the fields, readable text, request ids in and out, job events as lines,
which requests and job changes each mode writes, and the summary line."""

from __future__ import annotations

import io
import json
import logging
import re
from collections.abc import Iterator
from typing import Any

import pytest
from starlette.types import Message, Receive, Scope, Send

from app.domain.types import JobEvent
from app.http.access_log import AccessLog, LogMode
from app.http.timing import RequestDurations
from app.logs import (
    JobEventLog,
    JsonFormatter,
    LogSummary,
    RequestIds,
    TextFormatter,
    formatter_for,
    log_job_events,
    request_id,
)
from tests.logcapture import json_log_lines

TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")


@pytest.fixture
def lines() -> Iterator[io.StringIO]:
    """What the root logger writes at debug and above, as JSON lines."""
    with json_log_lines(logging.DEBUG) as out:
        yield out


def parsed(out: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.getvalue().splitlines()]


def test_a_json_line_has_time_level_event_message_and_the_extra_fields(
    lines: io.StringIO,
) -> None:
    logging.getLogger("jobq.test").warning(
        'job %d "odd" \u00e9', 7, extra={"event": "job.odd", "job_id": 7, "queue": "q", "x": None}
    )
    [line] = parsed(lines)
    assert TIME.fullmatch(line.pop("time"))
    assert line == {
        "level": "warning",
        "event": "job.odd",
        "message": 'job 7 "odd" \u00e9',
        "logger": "jobq.test",
        "job_id": 7,
        "queue": "q",
    }


def test_without_an_event_the_logger_name_stands_for_it_and_exceptions_are_kept(
    lines: io.StringIO,
) -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        logging.getLogger("jobq.auth").exception("authentication is off: no API key exists")
    [line] = parsed(lines)
    assert line["event"] == "jobq.auth" and line["level"] == "error"
    assert "authentication is off" in line["message"]
    assert "ValueError: boom" in line["exception"]


def test_uvicorns_access_line_becomes_an_http_request_event(lines: io.StringIO) -> None:
    token = request_id.set("abc")
    try:
        logging.getLogger("uvicorn.access").info(
            '%s - "%s %s HTTP/%s" %d', "127.0.0.1:5000", "GET", "/v1/queues", "1.1", 200
        )
    finally:
        request_id.reset(token)
    [line] = parsed(lines)
    assert line["event"] == "http.request"
    assert line["message"] == '127.0.0.1:5000 - "GET /v1/queues HTTP/1.1" 200'
    assert (line["method"], line["path"], line["status_code"], line["request_id"]) == (
        "GET",
        "/v1/queues",
        200,
        "abc",
    )


def test_text_lines_keep_the_message_then_the_fields() -> None:
    record = logging.makeLogRecord(
        {
            "name": "jobq.auth",
            "levelno": logging.WARNING,
            "levelname": "WARNING",
            "msg": "authentication is off: no API key exists",
            "event": "auth.off",
            "client": "10.0.0.1",
        }
    )
    text = TextFormatter().format(record)
    assert "WARNING jobq.auth authentication is off: no API key exists" in text
    assert text.endswith("[auth.off client=10.0.0.1]")


def test_auto_is_text_on_a_terminal_and_json_otherwise() -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    assert isinstance(formatter_for("auto", Terminal()), TextFormatter)
    assert isinstance(formatter_for("auto", io.StringIO()), JsonFormatter)
    assert isinstance(formatter_for("text", io.StringIO()), TextFormatter)
    assert isinstance(formatter_for("json", Terminal()), JsonFormatter)


def test_each_job_event_is_one_info_line_without_a_request_id(lines: io.StringIO) -> None:
    token = request_id.set("someone-elses")
    try:
        log_job_events(
            [
                JobEvent("claimed", 1, "emails", status="running", worker_id="w1", attempt=1),
                JobEvent("completed", 2, "emails", status="succeeded", worker_id="w1", key_id=3),
            ]
        )
    finally:
        request_id.reset(token)
    first, second = parsed(lines)
    assert first["event"] == "job.claimed" and first["level"] == "info"
    assert (first["job_id"], first["queue"], first["worker_id"], first["attempt"]) == (
        1,
        "emails",
        "w1",
        1,
    )
    assert (second["event"], second["status"], second["key_id"]) == (
        "job.completed",
        "succeeded",
        3,
    )
    assert "request_id" not in first and "request_id" not in second


def test_job_events_cost_nothing_below_info(lines: io.StringIO) -> None:
    jobs = logging.getLogger("jobq.jobs")
    jobs.setLevel(logging.WARNING)
    try:
        log_job_events([JobEvent("enqueued", 1, "q")])
    finally:
        jobs.setLevel(logging.NOTSET)
    assert lines.getvalue() == ""


async def _answered(headers: list[tuple[bytes, bytes]]) -> tuple[str | None, list[Message]]:
    seen: list[str | None] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        seen.append(request_id.get())
        await send({"type": "http.response.start", "status": 200, "headers": [(b"a", b"b")]})
        await send({"type": "http.response.body", "body": b""})

    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    async def receive() -> Message:
        return {"type": "http.request", "body": b""}

    await RequestIds(app)({"type": "http", "headers": headers}, receive, send)
    assert request_id.get() is None  # reset after the request
    return seen[0], sent


def _answer_id(sent: list[Message]) -> bytes:
    [value] = [v for k, v in sent[0]["headers"] if k == b"x-request-id"]
    assert (b"a", b"b") in sent[0]["headers"]
    return bytes(value)


async def test_a_sane_request_id_is_kept_and_answered() -> None:
    seen, sent = await _answered([(b"x-request-id", b"trace-1.2_A")])
    assert seen == "trace-1.2_A" and _answer_id(sent) == b"trace-1.2_A"


@pytest.mark.parametrize(
    "given", [b"", b"a" * 65, b"has space", b"new\nline", b'quote"', "\u00e9".encode()]
)
async def test_an_odd_request_id_is_replaced_by_a_fresh_one(given: bytes) -> None:
    seen, sent = await _answered([(b"x-request-id", given)])
    answered = _answer_id(sent)
    assert re.fullmatch(rb"[0-9a-f]{16}", answered) and seen == answered.decode()


async def test_without_a_request_id_each_request_gets_its_own() -> None:
    first, _ = await _answered([])
    second, _ = await _answered([])
    assert first and second and first != second


class Clock:
    """A clock the test moves: what the access log times requests and the summary intervals with."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def _request(
    access: AccessLog,
    clock: Clock,
    *,
    status: int = 200,
    seconds: float = 0.002,
    method: str = "POST",
    path: str = "/v1/claim",
    body: bytes = b"{}",
    query: bytes = b"",
) -> None:
    """One request through RequestIds with ``access``: answered ``status`` after ``seconds``."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await receive()
        clock.now += seconds
        await send({"type": "http.response.start", "status": status, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    async def receive() -> Message:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: Message) -> None:
        pass

    scope = {
        "type": "http",
        "method": method,
        "path": path,
        "query_string": query,
        "headers": [(b"x-request-id", b"r-1")],
        "client": ("10.0.0.7", 5000),
        "http_version": "1.1",
    }
    await RequestIds(app, access=access)(scope, receive, send)


def _access(lines: io.StringIO) -> list[dict[str, Any]]:
    return [line for line in parsed(lines) if line["event"] == "http.request"]


async def test_by_default_errors_and_slow_requests_get_a_line_and_a_fast_success_does_not(
    lines: io.StringIO,
) -> None:
    clock = Clock()
    access = AccessLog(clock=clock)  # the defaults: errors, slow past 1000 ms
    await _request(access, clock, status=200)
    await _request(access, clock, status=404, method="GET", path="/v1/jobs/9", body=b"")
    await _request(access, clock, status=503)
    await _request(access, clock, status=200, seconds=1.5, path="/v1/complete")
    not_found, unavailable, slow = _access(lines)
    assert (not_found["level"], not_found["path"], not_found["status_code"]) == (
        "info",
        "/v1/jobs/9",
        404,
    )
    assert not_found["request_id"] == "r-1" and not_found["client"] == "10.0.0.7:5000"
    assert "slow" not in not_found and not_found["duration_ms"] == 2.0
    assert (unavailable["level"], unavailable["status_code"]) == ("warning", 503)
    assert (slow["level"], slow["path"], slow["slow"], slow["duration_ms"]) == (
        "warning",
        "/v1/complete",
        True,
        1500.0,
    )
    assert slow["message"] == '10.0.0.7:5000 - "POST /v1/complete HTTP/1.1" 200 in 1500.0 ms'
    assert access.slow == 1


async def test_a_long_poll_is_slow_only_past_the_wait_it_asked_for(lines: io.StringIO) -> None:
    clock = Clock()
    access = AccessLog(clock=clock, slow_ms=1000)
    waits = b'{"worker_id": "w", "queues": ["q"], "wait_seconds": 5}'
    await _request(access, clock, body=waits, seconds=5.9)
    await _request(
        access, clock, method="GET", path="/v1/jobs/1", query=b"wait_seconds=5", seconds=5.9
    )
    assert _access(lines) == [] and access.slow == 0
    await _request(access, clock, body=waits, seconds=6.1)
    await _request(
        access, clock, method="GET", path="/v1/jobs/1", query=b"wait_seconds=5", seconds=6.1
    )
    claim, read = _access(lines)
    assert claim["slow"] and claim["path"] == "/v1/claim"
    assert read["slow"] and read["path"] == "/v1/jobs/1?wait_seconds=5"


@pytest.mark.parametrize(
    ("mode", "rate", "logged"),
    [
        ("all", 0.0, [200, 201, 404, 500]),
        ("sampled", 1.0, [200, 201, 404, 500]),
        ("sampled", 0.0, [404, 500]),
        ("errors", 1.0, [404, 500]),
        ("off", 1.0, []),
    ],
)
async def test_each_access_mode_writes_its_share(
    lines: io.StringIO, mode: LogMode, rate: float, logged: list[int]
) -> None:
    clock = Clock()
    access = AccessLog(mode=mode, sample_rate=rate, clock=clock)
    for status in (200, 201, 404, 500):
        await _request(access, clock, status=status)
    assert [line["status_code"] for line in _access(lines)] == logged


def _lifecycles(jobs: range) -> list[JobEvent]:
    events = []
    for kind in ("enqueued", "claimed", "completed"):
        events += [JobEvent(kind, job, "q", worker_id="w") for job in jobs]
    return events


def test_by_default_only_the_job_changes_that_are_news_get_a_line_and_all_are_counted(
    lines: io.StringIO,
) -> None:
    observer = JobEventLog()  # the default: errors
    observer(_lifecycles(range(1, 101)))
    observer(
        [
            JobEvent("failed", 7, "q", status="pending", attempt=1),
            JobEvent("dead", 8, "q", status="dead", attempt=10),
            JobEvent("reaped", 9, "q", status="pending"),
            JobEvent("webhook_delivered", 1, "q"),
        ]
    )
    assert [(line["event"], line["job_id"]) for line in parsed(lines)] == [
        ("job.failed", 7),
        ("job.dead", 8),
        ("job.reaped", 9),
    ]
    assert observer.counts == {
        "enqueued": 100,
        "claimed": 100,
        "completed": 100,
        "failed": 1,
        "dead": 1,
        "reaped": 1,
        "webhook_delivered": 1,
    }


def test_sampled_job_lines_keep_every_change_of_the_jobs_they_pick(lines: io.StringIO) -> None:
    JobEventLog(mode="sampled", sample_rate=0.25)(_lifecycles(range(1, 2001)))
    kinds_per_job: dict[int, list[str]] = {}
    for line in parsed(lines):
        kinds_per_job.setdefault(line["job_id"], []).append(line["event"])
    assert all(
        k == ["job.enqueued", "job.claimed", "job.completed"] for k in kinds_per_job.values()
    )
    assert 400 <= len(kinds_per_job) <= 600  # a quarter of 2,000 consecutive ids


@pytest.mark.parametrize(("mode", "count"), [("all", 6), ("off", 0)])
def test_all_job_lines_or_none(lines: io.StringIO, mode: LogMode, count: int) -> None:
    JobEventLog(mode=mode)(
        [*_lifecycles(range(1, 3))[:4], JobEvent("dead", 1, "q"), JobEvent("completed", 2, "q")]
    )
    assert len(parsed(lines)) == count


def test_the_summary_counts_requests_per_route_and_status_slow_ones_and_job_changes(
    lines: io.StringIO,
) -> None:
    clock = Clock()
    durations = RequestDurations()
    access, jobs = AccessLog(clock=clock), JobEventLog()
    summary = LogSummary(
        durations=durations, access=access, jobs=jobs, interval_seconds=60, clock=clock
    )
    summary.instance = "host-a:4711"
    for seconds in (0.002, 0.004):
        durations.observe("/v1/claim", "POST", "2xx", seconds)
    durations.observe("/v1/jobs/{job_id}", "GET", "4xx", 0.001)
    access.slow = 1
    jobs(_lifecycles(range(1, 3)))
    clock.now += 60

    assert summary.write() == 3
    [line] = parsed(lines)
    assert (line["event"], line["level"], line["logger"]) == ("summary", "info", "jobq.summary")
    assert line["message"] == (
        "3 requests in 60 s (2 2xx, 1 4xx), 1 slow; jobs: 2 enqueued, 2 claimed, 2 completed"
    )
    assert line["routes"] == {
        "GET /v1/jobs/{job_id} 4xx": {"count": 1, "mean_ms": 1.0},
        "POST /v1/claim 2xx": {"count": 2, "mean_ms": 3.0},
    }
    assert (line["seconds"], line["requests"], line["statuses"], line["slow_requests"]) == (
        60.0,
        3,
        {"2xx": 2, "4xx": 1},
        1,
    )
    assert line["jobs"] == {"enqueued": 2, "claimed": 2, "completed": 2}
    assert line["instance"] == "host-a:4711"

    # Each line counts what happened since the last tick; a tick with nothing to count writes
    # nothing.
    clock.now += 60
    assert summary.write() == 0 and len(parsed(lines)) == 1
    durations.observe("/v1/claim", "POST", "2xx", 0.010)
    jobs([JobEvent("failed", 5, "q")])
    clock.now += 30
    assert summary.write() == 1
    latest = parsed(lines)[-1]
    assert latest["routes"] == {"POST /v1/claim 2xx": {"count": 1, "mean_ms": 10.0}}
    assert (latest["seconds"], latest["slow_requests"], latest["jobs"]) == (30.0, 0, {"failed": 1})
