"""The Client against httpx.MockTransport: request shapes, answers, and problem details as JobqError."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from jobq_client import Client, JobqError

REPO_ROOT = Path(__file__).resolve().parents[2]


class Recorder:
    """A MockTransport handler that records requests and answers from a function of the request."""

    def __init__(self, answer: Callable[[httpx.Request], httpx.Response] | None = None) -> None:
        self.requests: list[httpx.Request] = []
        self.answer = answer or (lambda request: httpx.Response(200, json={}))

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        return self.answer(request)

    @property
    def last(self) -> httpx.Request:
        return self.requests[-1]

    def last_json(self) -> Any:
        return json.loads(self.last.content)


def client_for(recorder: Recorder) -> Client:
    return Client("http://jobq.test", transport=httpx.MockTransport(recorder))


async def test_enqueue_sends_every_given_field() -> None:
    rec = Recorder(lambda r: httpx.Response(201, json={"id": 7, **json.loads(r.content)}))
    async with client_for(rec) as client:
        job = await client.enqueue(
            "welcome",
            {"user": 42},
            queue="emails",
            priority=3,
            run_at=datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC),
            max_attempts=4,
            lease_seconds=60,
            timeout_seconds=300,
            idempotency_key="signup-42",
        )
    assert rec.last.method == "POST" and rec.last.url.path == "/v1/jobs"
    assert rec.last_json() == {
        "queue": "emails",
        "type": "welcome",
        "payload": {"user": 42},
        "priority": 3,
        "run_at": "2030-01-02T03:04:05+00:00",
        "max_attempts": 4,
        "lease_seconds": 60,
        "timeout_seconds": 300,
        "idempotency_key": "signup-42",
    }
    assert job["id"] == 7 and job["idempotency_key"] == "signup-42"


async def test_enqueue_leaves_out_options_not_given() -> None:
    rec = Recorder(lambda r: httpx.Response(201, json={"id": 1}))
    async with client_for(rec) as client:
        await client.enqueue("t")
        await client.enqueue("t", None, delay_seconds=1.5, run_at=None)
    first, second = (json.loads(r.content) for r in rec.requests)
    # Each call's own key, so that it can be sent again safely.
    keys = [first.pop("idempotency_key"), second.pop("idempotency_key")]
    assert all(key.startswith("auto:") for key in keys) and keys[0] != keys[1]
    assert first == {"queue": "default", "type": "t", "payload": None, "priority": 0}
    assert second == {**first, "delay_seconds": 1.5}


async def test_batch_read_list_cancel_retry_requests() -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/jobs/batch":
            return httpx.Response(201, json={"jobs": [{"id": 1}, {"id": 2}]})
        if request.url.path == "/v1/jobs":
            return httpx.Response(200, json={"jobs": [{"id": 9}], "next_cursor": "abc"})
        return httpx.Response(200, json={"id": 5, "path": request.url.path})

    rec = Recorder(answer)
    async with client_for(rec) as client:
        created = await client.enqueue_batch(
            [{"type": "a"}, {"type": "b", "run_at": datetime(2030, 1, 1, tzinfo=UTC)}]
        )
        assert [j["id"] for j in created] == [1, 2]
        sent = rec.last_json()["jobs"]
        keys = [job.pop("idempotency_key") for job in sent]
        assert all(key.startswith("auto:") for key in keys) and keys[0] != keys[1]
        assert sent == [{"type": "a"}, {"type": "b", "run_at": "2030-01-01T00:00:00+00:00"}]
        assert (await client.get_job(5))["path"] == "/v1/jobs/5"
        assert rec.last.method == "GET"
        page = await client.list_jobs(queue="emails", status="dead", limit=10, after="xyz")
        assert page == {"jobs": [{"id": 9}], "next_cursor": "abc"}
        assert dict(rec.last.url.params) == {
            "queue": "emails",
            "status": "dead",
            "limit": "10",
            "after": "xyz",
        }
        await client.cancel(5)
        assert (rec.last.method, rec.last.url.path) == ("POST", "/v1/jobs/5/cancel")
        await client.retry(5)
        assert (rec.last.method, rec.last.url.path) == ("POST", "/v1/jobs/5/retry")


async def test_claim_and_lease_calls_send_the_worker_protocol() -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/claim":
            return httpx.Response(200, json={"jobs": [{"id": 3, "lease_id": "L3"}]})
        leases = json.loads(request.content)["leases"]
        return httpx.Response(
            200, json={"results": [{"job_id": i["job_id"], "ok": True} for i in leases]}
        )

    rec = Recorder(answer)
    async with Client("http://jobq.test", timeout=5, transport=httpx.MockTransport(rec)) as client:
        jobs = await client.claim("w1", ["a", "b"], max_jobs=10, lease_seconds=60, wait_seconds=20)
        assert jobs == [{"id": 3, "lease_id": "L3"}]
        assert (rec.last.url.path, rec.last_json()) == (
            "/v1/claim",
            {
                "worker_id": "w1",
                "queues": ["a", "b"],
                "max_jobs": 10,
                "lease_seconds": 60,
                "wait_seconds": 20,
            },
        )
        # A long-poll may take the whole wait: the read timeout covers it.
        assert rec.last.extensions["timeout"]["read"] == 25
        await client.claim("w1", ["a"])
        assert rec.last_json() == {
            "worker_id": "w1",
            "queues": ["a"],
            "max_jobs": 1,
            "wait_seconds": 0,
        }

        ref = {"job_id": 3, "lease_id": "L3"}
        calls = {
            "heartbeat": {**ref, "lease_seconds": 60, "checkpoint": {"n": 1}, "progress": 0.5},
            "complete": {**ref, "result": {"ok": 1}},
            "fail": {**ref, "error": "boom", "retryable": False},
            "release": {**ref, "checkpoint": {"n": 2}},
        }
        for operation, item in calls.items():
            results = await getattr(client, operation)("w1", [item])
            assert results == [{"job_id": 3, "ok": True}]
            assert rec.last.url.path == f"/v1/{operation}"
            assert rec.last_json() == {"worker_id": "w1", "leases": [item]}


async def test_error_answer_raises_jobq_error_with_the_problem() -> None:
    problem = {
        "type": "https://jobq.dev/problems/validation-error",
        "title": "Unprocessable Content",
        "status": 422,
        "detail": "invalid request: body.queue",
        "errors": [{"field": "body.queue", "message": "String should match pattern"}],
    }
    rec = Recorder(
        lambda r: httpx.Response(
            422, json=problem, headers={"content-type": "application/problem+json"}
        )
    )
    async with client_for(rec) as client:
        with pytest.raises(JobqError) as caught:
            await client.enqueue("t", queue="no spaces")
    error = caught.value
    assert error.status == 422 and error.problem == problem
    assert error.errors == problem["errors"] and not error.transient
    text = str(error)
    assert "Unprocessable Content" in text and "invalid request: body.queue" in text
    assert "body.queue: String should match pattern" in text


async def test_not_found_and_a_non_json_5xx_raise_jobq_error() -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/jobs/404":
            return httpx.Response(404, json={"title": "Not Found", "detail": "no job 404"})
        return httpx.Response(502, text="<html>bad gateway</html>")

    async with client_for(Recorder(answer)) as client:
        with pytest.raises(JobqError) as missing:
            await client.get_job(404)
        assert missing.value.status == 404 and missing.value.detail == "no job 404"
        with pytest.raises(JobqError) as gateway:
            await client.get_job(1)
    assert gateway.value.status == 502 and gateway.value.transient
    assert "bad gateway" in str(gateway.value)


def test_importing_the_client_does_not_import_app() -> None:
    code = (
        "import sys, jobq_client, jobq_client.cli\n"
        "bad = sorted(m for m in sys.modules if m == 'app' or m.startswith('app.'))\n"
        "assert not bad, bad\n"
        "print('ok')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_client_sources_import_only_the_standard_library_and_httpx() -> None:
    # opentelemetry: imported when the application has it (jobq_client/tracing.py), never required.
    allowed = set(sys.stdlib_module_names) | {"httpx", "jobq_client", "__future__", "opentelemetry"}
    found: set[str] = set()
    for path in (REPO_ROOT / "jobq_client").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                found.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.split(".")[0])
    assert "httpx" in found and found <= allowed, sorted(found - allowed)


def test_client_sources_write_private_attributes_only_on_self() -> None:
    offenders: list[str] = []
    for path in (REPO_ROOT / "jobq_client").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets: list[ast.expr] = []
            if isinstance(node, ast.Assign):
                targets = node.targets
            elif isinstance(node, ast.AugAssign | ast.AnnAssign):
                targets = [node.target]
            for target in targets:
                if (
                    isinstance(target, ast.Attribute)
                    and target.attr.startswith("_")
                    and not (isinstance(target.value, ast.Name) and target.value.id == "self")
                ):
                    offenders.append(f"{path.name}:{node.lineno} {ast.unparse(target)}")
    assert not offenders, offenders


async def test_only_requests_safe_to_repeat_are_sent_again_after_a_dropped_connection() -> None:
    drops: dict[str, int] = {}

    def answer(request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if not drops.get(path):
            drops[path] = 1
            raise httpx.RemoteProtocolError("Server disconnected without sending a response.")
        drops[path] += 1
        if path == "/v1/jobs/3":
            return httpx.Response(200, json={"id": 3})
        if path == "/v1/complete":
            return httpx.Response(200, json={"results": [{"job_id": 3, "ok": True}]})
        return httpx.Response(201, json={"id": 3})

    rec = Recorder(answer)
    async with client_for(rec) as client:
        assert (await client.get_job(3))["id"] == 3
        assert (await client.enqueue("t"))["id"] == 3
        [done] = await client.complete("w", [{"job_id": 3, "lease_id": "l"}])
        assert done["ok"] is True
        with pytest.raises(httpx.RemoteProtocolError):
            await client.claim("w", ["q"])
        with pytest.raises(httpx.RemoteProtocolError):
            await client.cancel(3)
    assert drops == {
        "/v1/jobs/3": 2,
        "/v1/jobs": 2,
        "/v1/complete": 2,
        "/v1/claim": 1,
        "/v1/jobs/3/cancel": 1,
    }
    enqueues = [json.loads(r.content) for r in rec.requests if r.url.path == "/v1/jobs"]
    assert enqueues[0]["idempotency_key"] == enqueues[1]["idempotency_key"]


async def test_a_timeout_is_not_sent_again() -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("timed out")

    rec = Recorder(answer)
    async with client_for(rec) as client:
        with pytest.raises(httpx.ReadTimeout):
            await client.get_job(1)
    assert len(rec.requests) == 1
