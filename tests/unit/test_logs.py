"""Log lines: JSON with the fields, readable text, request ids in and out, job events as lines."""

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
from app.logs import (
    JsonFormatter,
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
