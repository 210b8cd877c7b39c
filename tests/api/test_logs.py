"""Logs of the app in process: request ids in the answer and on its lines, job events, refusals,
what the default writes (errors, slow requests, a summary) and what ``all`` does."""

from __future__ import annotations

import io
import json
import logging
import re
import signal
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy.ext.asyncio import AsyncEngine

from app.api.state import app_state
from app.auth.keys import Role
from app.logs import LogSummary
from tests.api.helpers import claim, enqueue, lease, lease_call, running_app
from tests.keys import make_key
from tests.logcapture import json_log_lines
from tests.processes import JobqServers


@pytest.fixture
def log_lines() -> Iterator[io.StringIO]:
    """Every record at info and above, as the JSON lines `jobq serve` writes."""
    with json_log_lines(logging.INFO) as out:
        yield out


def parsed_all(out: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.getvalue().splitlines()]


def parsed(out: io.StringIO, event: str) -> list[dict[str, Any]]:
    return [line for line in parsed_all(out) if line["event"] == event]


async def test_every_answer_carries_a_request_id_fast_path_included(
    client: httpx.AsyncClient,
) -> None:
    given = await client.post(
        "/v1/jobs", json={"queue": "q", "type": "t"}, headers={"X-Request-Id": "abc-1"}
    )
    assert given.status_code == 201 and given.headers["x-request-id"] == "abc-1"
    made = await client.get("/v1/queues", headers={"X-Request-Id": "not sane!"})
    assert made.status_code == 200 and re.fullmatch(r"[0-9a-f]{16}", made.headers["x-request-id"])
    problem = await client.get("/v1/jobs/999999")
    assert problem.status_code == 404 and problem.headers["x-request-id"]


def summary_loop(app: FastAPI) -> LogSummary:
    [summary] = [s for s in app_state(app).running().runner.loops if isinstance(s, LogSummary)]
    return summary


async def test_by_default_an_error_gets_a_line_a_successful_claim_none_and_the_summary_counts_both(
    app: FastAPI, client: httpx.AsyncClient, log_lines: io.StringIO
) -> None:
    await enqueue(client, queue="emails")
    [held] = await claim(client, "w1", ["emails"])
    await lease_call(client, "complete", "w1", lease(held))
    missing = await client.get("/v1/jobs/999999", headers={"X-Request-Id": "r-404"})
    assert missing.status_code == 404

    [line] = parsed(log_lines, "http.request")
    assert (line["level"], line["method"], line["path"], line["status_code"]) == (
        "info",
        "GET",
        "/v1/jobs/999999",
        404,
    )
    assert line["request_id"] == "r-404" and line["logger"] == "jobq.access"
    assert not any(e.startswith("job.") for e in {x["event"] for x in parsed_all(log_lines)})

    await summary_loop(app).run_batch()  # the tick, as the runner calls it every minute
    [summary] = parsed(log_lines, "summary")
    assert {route: v["count"] for route, v in summary["routes"].items()} == {
        "POST /v1/jobs 2xx": 1,
        "POST /v1/claim 2xx": 1,
        "POST /v1/complete 2xx": 1,
        "GET /v1/jobs/{job_id} 4xx": 1,
    }
    assert (summary["requests"], summary["statuses"]) == (4, {"2xx": 3, "4xx": 1})
    assert summary["jobs"] == {"enqueued": 1, "claimed": 1, "completed": 1}


async def test_by_default_a_slow_request_is_a_warning(
    database_url: str, clean_db: AsyncEngine, log_lines: io.StringIO
) -> None:
    async with running_app(database_url, log_slow_request_ms=0.001) as client:
        answer = await client.get("/v1/queues")
    [line] = parsed(log_lines, "http.request")
    assert (line["level"], line["path"], line["status_code"], line["slow"]) == (
        "warning",
        "/v1/queues",
        200,
        True,
    )
    assert line["request_id"] == answer.headers["x-request-id"] and line["duration_ms"] >= 0


async def test_all_writes_every_request_and_every_job_state_change(
    database_url: str, clean_db: AsyncEngine, log_lines: io.StringIO
) -> None:
    async with running_app(database_url, log_access="all", log_jobs="all") as client:
        job = await enqueue(client, queue="emails")
        [held] = await claim(client, "w1", ["emails"])
        await lease_call(client, "complete", "w1", lease(held))

    requests = parsed(log_lines, "http.request")
    assert [(r["method"], r["path"], r["status_code"]) for r in requests] == [
        ("POST", "/v1/jobs", 201),
        ("POST", "/v1/claim", 200),
        ("POST", "/v1/complete", 200),
    ]
    assert all(r["level"] == "info" and r["request_id"] for r in requests)
    lines = [line for line in parsed_all(log_lines) if line["event"].startswith("job.")]
    assert [(line["event"], line["job_id"], line["queue"]) for line in lines] == [
        ("job.enqueued", job["id"], "emails"),
        ("job.claimed", job["id"], "emails"),
        ("job.completed", job["id"], "emails"),
    ]
    assert [line.get("worker_id") for line in lines] == [None, "w1", "w1"]
    assert lines[-1]["status"] == "succeeded" and lines[-1]["level"] == "info"


async def test_a_rejected_key_is_a_warning_with_the_request_id_and_never_the_secret(
    app: FastAPI, client: httpx.AsyncClient, clean_db: AsyncEngine, log_lines: io.StringIO
) -> None:
    secret = await make_key(clean_db, "mailer", Role.ADMIN)
    await app_state(app).running().keys.refresh()
    wrong = secret[:-4] + ("aaaa" if not secret.endswith("aaaa") else "bbbb")

    refused = await client.get(
        "/v1/queues", headers={"Authorization": f"Bearer {wrong}", "X-Request-Id": "r-1"}
    )
    missing = await client.post("/v1/claim", json={"worker_id": "w", "queues": ["q"]})
    basic = await client.get("/v1/queues", headers={"Authorization": f"Basic {secret}"})
    allowed = await client.get("/v1/queues", headers={"Authorization": f"Bearer {secret}"})
    assert [r.status_code for r in (refused, missing, basic, allowed)] == [401, 401, 401, 200]

    lines = parsed(log_lines, "auth.rejected")
    assert [(line["reason"], line["level"], line["key"]) for line in lines] == [
        ("invalid_key", "warning", "unknown"),
        ("no_key", "warning", "unknown"),
        ("not_bearer", "warning", "unknown"),
    ]
    assert [line["request_id"] for line in lines] == [
        "r-1",
        missing.headers["x-request-id"],
        basic.headers["x-request-id"],
    ]
    assert all(line["client"] == "127.0.0.1" for line in lines)
    text = log_lines.getvalue()
    assert secret[10:] not in text and wrong[10:] not in text and "Bearer" not in text


async def test_past_the_failure_budget_each_429_is_a_warning(
    app: FastAPI, client: httpx.AsyncClient, clean_db: AsyncEngine, log_lines: io.StringIO
) -> None:
    await make_key(clean_db, "mailer", Role.ADMIN)
    runtime = app_state(app).running()
    await runtime.keys.refresh()
    for _ in range(runtime.failures.per_minute):
        runtime.failures.failed("127.0.0.1")
    limited = await client.get("/v1/queues", headers={"Authorization": "Bearer nope"})
    assert limited.status_code == 429
    [line] = parsed(log_lines, "auth.rejected")
    assert (
        line["reason"] == "too_many_failures"
        and line["request_id"] == limited.headers["x-request-id"]
    )
    assert "nope" not in log_lines.getvalue()


@pytest.mark.acceptance
async def test_jobq_serve_writes_json_lines_errors_and_a_summary_by_default(
    jobq_servers: JobqServers, clean_db: AsyncEngine
) -> None:
    server = await jobq_servers.start(
        env={"JOBQ_LOG_FORMAT": "json", "JOBQ_INSTANCE_NAME": "summary-host"}
    )
    async with httpx.AsyncClient(base_url=server.url) as http:
        answer = await http.post(
            "/v1/jobs", json={"queue": "q", "type": "t"}, headers={"X-Request-Id": "p-1"}
        )
        missing = await http.get("/v1/jobs/999999", headers={"X-Request-Id": "p-2"})
    assert answer.status_code == 201 and answer.headers["x-request-id"] == "p-1"
    assert missing.status_code == 404
    server.send_signal(signal.SIGTERM)
    assert await server.wait_exit(20) == 0
    # What `jobq serve` prints before serving is not a log record; every record is a JSON line.
    lines = [
        json.loads(line) for line in server.log_text(100_000).splitlines() if line.startswith("{")
    ]
    events = {line["event"] for line in lines}
    assert {"http.request", "summary", "jobq.auth"} <= events, lines
    [off] = [line for line in lines if "authentication is off" in line["message"]]
    assert off["level"] == "warning"
    # The default: no line for the enqueue (nor its job.enqueued), one for the 404, and
    # uvicorn's own access line is off.
    assert not [line for line in lines if line.get("request_id") == "p-1"]
    assert "job.enqueued" not in events and "uvicorn.access" not in {x["logger"] for x in lines}
    [request] = [line for line in lines if line.get("request_id") == "p-2"]
    assert (request["event"], request["path"], request["status_code"]) == (
        "http.request",
        "/v1/jobs/999999",
        404,
    )
    # The last summary is written at shutdown: it counts the enqueue (and the readiness checks).
    [summary] = [line for line in lines if line["event"] == "summary"]
    assert summary["routes"]["POST /v1/jobs 2xx"]["count"] == 1
    assert summary["jobs"] == {"enqueued": 1}
    assert summary["instance"] == "summary-host"  # which of several processes counted
    assert any("Application shutdown complete" in line["message"] for line in lines)
    others = [
        line
        for line in server.log_text(100_000).splitlines()
        if line and not line.startswith("{") and not line.startswith("jobq serving on")
    ]
    assert not others, others
