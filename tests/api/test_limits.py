"""Limits come from Settings: requests are validated against them and OpenAPI shows them."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from asgi_lifespan import LifespanManager
from sqlalchemy.ext.asyncio import AsyncEngine

from app.main import create_app
from app.settings import Settings

SMALL = {
    "claim_max_jobs": 3,
    "batch_max_jobs": 2,
    "lease_batch_max": 2,
    "list_max_limit": 7,
    "longpoll_max_wait_seconds": 2,
    "checkpoint_max_bytes": 1024,
    "progress_max_bytes": 256,
    "claim_max_queues": 2,
    "queue_name_max_chars": 8,
    "type_max_chars": 5,
    "worker_id_max_chars": 6,
    "idempotency_key_max_chars": 4,
}


@pytest.fixture
async def small(database_url: str, clean_db: AsyncEngine) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(Settings(database_url=database_url, maintenance_enabled=False, **SMALL))
    async with LifespanManager(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://jobq.test") as c:
            yield c


def _fields(response: httpx.Response) -> list[str]:
    assert response.status_code == 422, response.text
    return [e["field"] for e in response.json()["errors"]]


async def test_requests_over_the_configured_limits_are_refused_naming_the_field(
    small: httpx.AsyncClient,
) -> None:
    lease = {"job_id": 1, "lease_id": str(uuid.uuid4())}
    claim = {"worker_id": "w", "queues": ["q"]}
    cases: list[tuple[str, str, dict[str, Any], str]] = [
        ("post", "/v1/claim", {**claim, "max_jobs": 4}, "body.max_jobs"),
        ("post", "/v1/claim", {**claim, "wait_seconds": 2.5}, "body.wait_seconds"),
        ("post", "/v1/claim", {**claim, "queues": ["a", "b", "c"]}, "body.queues"),
        ("post", "/v1/claim", {**claim, "queues": ["q" * 9]}, "body.queues[0]"),
        ("post", "/v1/claim", {**claim, "worker_id": "w" * 7}, "body.worker_id"),
        ("post", "/v1/complete", {"worker_id": "w" * 7, "leases": [lease]}, "body.worker_id"),
        ("post", "/v1/jobs", {"queue": "q" * 9, "type": "t"}, "body.queue"),
        ("post", "/v1/jobs", {"type": "t" * 6}, "body.type"),
        ("post", "/v1/jobs", {"type": "t", "idempotency_key": "k" * 5}, "body.idempotency_key"),
        ("post", "/v1/jobs/batch", {"jobs": [{"type": "t" * 6}]}, "body.jobs[0].type"),
        ("post", f"/v1/queues/{'q' * 9}/pause", {}, "path.name"),
        ("post", "/v1/jobs/batch", {"jobs": [{"type": "t"}] * 3}, "body.jobs"),
        ("post", "/v1/complete", {"worker_id": "w", "leases": [lease] * 3}, "body.leases"),
        (
            "post",
            "/v1/heartbeat",
            {"worker_id": "w", "leases": [{**lease, "checkpoint": "x" * 1024}]},
            "body.leases[0].checkpoint",
        ),
        (
            "post",
            "/v1/heartbeat",
            {"worker_id": "w", "leases": [{**lease, "progress": "x" * 256}]},
            "body.leases[0].progress",
        ),
        (
            "post",
            "/v1/release",
            {"worker_id": "w", "leases": [{**lease, "checkpoint": "x" * 1024}]},
            "body.leases[0].checkpoint",
        ),
    ]
    for method, path, body, field in cases:
        response = await small.request(method, path, json=body)
        assert field in _fields(response), (path, response.text)
    assert "query.limit" in _fields(await small.get("/v1/jobs", params={"limit": 8}))
    assert "query.queue" in _fields(await small.get("/v1/jobs", params={"queue": "q" * 9}))
    assert "query.type" in _fields(await small.get("/v1/jobs", params={"type": "t" * 6}))


async def test_requests_at_the_configured_limits_are_taken(small: httpx.AsyncClient) -> None:
    r = await small.post("/v1/jobs/batch", json={"jobs": [{"type": "t"}] * 2})
    assert r.status_code == 201, r.text
    at_limits = {"queue": "q" * 8, "type": "t" * 5, "idempotency_key": "k" * 4}
    r = await small.post("/v1/jobs", json=at_limits)
    assert r.status_code == 201, r.text
    r = await small.post("/v1/claim", json={"worker_id": "w" * 6, "queues": ["q" * 8, "x"]})
    assert r.status_code == 200 and len(r.json()["jobs"]) == 1, r.text
    r = await small.post("/v1/claim", json={"worker_id": "w", "queues": ["default"], "max_jobs": 3})
    assert r.status_code == 200 and len(r.json()["jobs"]) == 2
    assert (await small.get("/v1/jobs", params={"limit": 7})).status_code == 200


async def test_openapi_shows_the_limits_in_force(small: httpx.AsyncClient) -> None:
    doc = (await small.get("/openapi.json")).json()
    schemas = doc["components"]["schemas"]
    assert schemas["ClaimRequest"]["properties"]["max_jobs"]["maximum"] == 3
    assert schemas["ClaimRequest"]["properties"]["wait_seconds"]["maximum"] == 2
    assert schemas["EnqueueBatchRequest"]["properties"]["jobs"]["maxItems"] == 2
    assert schemas["CompleteRequest"]["properties"]["leases"]["maxItems"] == 2
    assert "1024 bytes" in str(schemas["HeartbeatItem"]["properties"]["checkpoint"])
    params = doc["paths"]["/v1/jobs"]["get"]["parameters"]
    [limit] = [p for p in params if p["name"] == "limit"]
    assert limit["schema"]["maximum"] == 7
    assert schemas["ClaimRequest"]["properties"]["queues"]["maxItems"] == 2
    assert schemas["ClaimRequest"]["properties"]["worker_id"]["maxLength"] == 6
    assert schemas["EnqueueRequest"]["properties"]["type"]["maxLength"] == 5
    assert schemas["EnqueueRequest"]["properties"]["queue"]["pattern"].endswith("{0,7}$")
    key = schemas["EnqueueRequest"]["properties"]["idempotency_key"]
    assert {"type": "string", "maxLength": 4, "minLength": 1} in key["anyOf"]
    [name] = doc["paths"]["/v1/queues/{name}/pause"]["post"]["parameters"]
    assert name["schema"]["pattern"].endswith("{0,7}$")
