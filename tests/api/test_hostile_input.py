"""Bad input gets a clear 4xx problem naming the field; nothing is written, nothing answers 500."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

LEASE = {"job_id": 1, "lease_id": str(uuid.uuid4())}

RAW_CASES: list[tuple[str, bytes, str]] = [
    ("/v1/jobs", b'{"type": "t", "payload": NaN}', "body"),
    ("/v1/jobs", b'{"type": "t", "payload": Infinity}', "body"),
    ("/v1/jobs", b'{"type": "t", "payload": -Infinity}', "body"),
    ("/v1/jobs", b'{"type": "t", "payload": 1e400}', "body"),
    ("/v1/jobs", b'{"type": "t", "payload": {"a": "x\\u0000y"}}', "body.payload.a"),
    ("/v1/jobs", b'{"type": "t", "payload": {"k\\u0000": 1}}', "body.payload"),
    ("/v1/jobs", b'{"type": "t\\u0000"}', "body.type"),
    ("/v1/jobs", b'{"type": "t", "payload": "\\ud800"}', "body.payload"),
    ("/v1/jobs", b'{"type": "t", "payload": ' + b"[" * 5000 + b"]" * 5000 + b"}", "body"),
    ("/v1/jobs", b'{"type": "t"', "body"),
    ("/v1/jobs", b"\xff\xfe", "body"),
    ("/v1/jobs", b'{"type": "t", "payload": ' + b"9" * 5000 + b"}", "body"),
    (
        "/v1/heartbeat",
        b'{"worker_id": "w", "leases": [{"job_id": 1, "lease_id": "'
        + LEASE["lease_id"].encode()
        + b'", "checkpoint": NaN}]}',
        "body",
    ),
]


@pytest.mark.parametrize(("path", "raw", "field"), RAW_CASES)
async def test_unstorable_json_is_422_naming_field(
    client: httpx.AsyncClient, clean_db: AsyncEngine, path: str, raw: bytes, field: str
) -> None:
    r = await client.post(path, content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 422, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    assert r.json()["errors"][0]["field"] == field
    async with clean_db.connect() as conn:
        assert (await conn.execute(text("SELECT count(*) FROM jobs"))).scalar_one() == 0


FIELD_CASES: list[tuple[str, dict[str, Any], str]] = [
    ("/v1/jobs", {"type": "t", "queue": "bad queue"}, "body.queue"),
    ("/v1/jobs", {"type": "t", "queue": ""}, "body.queue"),
    ("/v1/jobs", {"type": "t", "queue": "q" * 129}, "body.queue"),
    ("/v1/jobs", {"type": "t", "queue": "-leading"}, "body.queue"),
    ("/v1/jobs", {"type": ""}, "body.type"),
    ("/v1/jobs", {"queue": "q"}, "body.type"),
    ("/v1/jobs", {"type": "t", "surprise": 1}, "body.surprise"),
    ("/v1/jobs", {"type": "t", "priority": 2**31}, "body.priority"),
    ("/v1/jobs", {"type": "t", "priority": "high"}, "body.priority"),
    ("/v1/jobs", {"type": "t", "max_attempts": 0}, "body.max_attempts"),
    ("/v1/jobs", {"type": "t", "lease_seconds": 43201}, "body.lease_seconds"),
    ("/v1/jobs", {"type": "t", "delay_seconds": -1}, "body.delay_seconds"),
    ("/v1/jobs", {"type": "t", "run_at": "yesterday"}, "body.run_at"),
    ("/v1/jobs", {"type": "t", "idempotency_key": ""}, "body.idempotency_key"),
    ("/v1/jobs/batch", {"jobs": [{"type": "t"}] * 1001}, "body.jobs"),
    ("/v1/claim", {"worker_id": "w", "queues": []}, "body.queues"),
    ("/v1/claim", {"worker_id": "w", "queues": ["q"], "max_jobs": 101}, "body.max_jobs"),
    ("/v1/claim", {"worker_id": "w", "queues": ["q"], "max_jobs": 0}, "body.max_jobs"),
    ("/v1/claim", {"worker_id": "w", "queues": ["q"], "lease_seconds": 0}, "body.lease_seconds"),
    ("/v1/claim", {"worker_id": "w", "queues": ["q"], "wait_seconds": 21}, "body.wait_seconds"),
    ("/v1/claim", {"worker_id": "", "queues": ["q"]}, "body.worker_id"),
    ("/v1/claim", {"queues": ["q"]}, "body.worker_id"),
    ("/v1/heartbeat", {"worker_id": "w", "leases": []}, "body.leases"),
    (
        "/v1/heartbeat",
        {"worker_id": "w", "leases": [{"job_id": 1, "lease_id": "nope"}]},
        "body.leases[0].lease_id",
    ),
    (
        "/v1/complete",
        {"worker_id": "w", "leases": [{**LEASE, "job_id": 2**63}]},
        "body.leases[0].job_id",
    ),
    (
        "/v1/complete",
        {"worker_id": "w", "leases": [{**LEASE, "job_id": 0}]},
        "body.leases[0].job_id",
    ),
    (
        "/v1/fail",
        {"worker_id": "w", "leases": [{**LEASE, "retry_after_seconds": -5}]},
        "body.leases[0].retry_after_seconds",
    ),
    (
        "/v1/release",
        {"worker_id": "w", "leases": [{**LEASE, "delay_seconds": 10**9}]},
        "body.leases[0].delay_seconds",
    ),
    (
        "/v1/release",
        {"worker_id": "w", "leases": [{**LEASE, "extra": True}]},
        "body.leases[0].extra",
    ),
]


@pytest.mark.parametrize(("path", "body", "field"), FIELD_CASES)
async def test_invalid_fields_are_422_naming_field(
    client: httpx.AsyncClient, path: str, body: dict[str, Any], field: str
) -> None:
    r = await client.post(path, json=body)
    assert r.status_code == 422, r.text
    problem = r.json()
    assert problem["status"] == 422 and problem["title"]
    assert field in [e["field"] for e in problem["errors"]], problem


async def test_body_over_limit_is_413_problem(client: httpx.AsyncClient) -> None:
    big = b'{"type": "t", "payload": "' + b"x" * (70 * 1024) + b'"}'
    r = await client.post("/v1/jobs", content=big, headers={"content-type": "application/json"})
    assert r.status_code == 413
    assert r.headers["content-type"].startswith("application/problem+json")


async def test_streamed_body_over_limit_is_413_problem(client: httpx.AsyncClient) -> None:
    async def chunks():  # type: ignore[no-untyped-def]
        yield b'{"type": "t", "payload": "'
        for _ in range(100):
            yield b"x" * 1024
        yield b'"}'

    r = await client.post(
        "/v1/jobs", content=chunks(), headers={"content-type": "application/json"}
    )
    assert r.status_code == 413
    assert r.headers["content-type"].startswith("application/problem+json")


async def test_unknown_route_and_method_are_problems(client: httpx.AsyncClient) -> None:
    r = await client.get("/v1/nothing-here")
    assert r.status_code == 404 and r.headers["content-type"].startswith("application/problem")
    r = await client.delete("/v1/claim")
    assert r.status_code == 405 and r.headers["content-type"].startswith("application/problem")


async def test_wrong_content_type_is_4xx(client: httpx.AsyncClient) -> None:
    r = await client.post(
        "/v1/jobs", content=b"type=t", headers={"content-type": "application/x-www-form-urlencoded"}
    )
    assert 400 <= r.status_code < 500
