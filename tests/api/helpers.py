"""Small HTTP helpers shared by the API tests."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
from asgi_lifespan import LifespanManager

from app.main import create_app
from app.settings import Settings

# A backstop far longer than any wait in the tests: a long poll that returns early was woken,
# not polled.
SLOW_BACKSTOP = 20.0


@asynccontextmanager
async def running_app(database_url: str, **overrides: Any) -> AsyncIterator[httpx.AsyncClient]:
    """An app with its lifespan (control connection, optional maintenance) and a client of it;
    ``client.app`` is the app."""
    settings = {
        "database_url": database_url,
        "maintenance_enabled": False,
        "longpoll_backstop_seconds": SLOW_BACKSTOP,
        **overrides,
    }
    application = create_app(Settings(**settings))
    async with LifespanManager(application):
        transport = httpx.ASGITransport(app=application)
        async with httpx.AsyncClient(
            transport=transport, base_url="http://jobq.test", timeout=30
        ) as client:
            client.app = application  # type: ignore[attr-defined]
            yield client


async def enqueue(client: httpx.AsyncClient, **fields: Any) -> dict[str, Any]:
    body = {"queue": "default", "type": "t", **fields}
    r = await client.post("/v1/jobs", json=body)
    assert r.status_code == 201, r.text
    job: dict[str, Any] = r.json()
    return job


async def claim(
    client: httpx.AsyncClient, worker: str = "w1", queues: list[str] | None = None, **fields: Any
) -> list[dict[str, Any]]:
    body = {"worker_id": worker, "queues": queues or ["default"], **fields}
    r = await client.post("/v1/claim", json=body)
    assert r.status_code == 200, r.text
    jobs: list[dict[str, Any]] = r.json()["jobs"]
    return jobs


async def lease_call(
    client: httpx.AsyncClient, op: str, worker: str, *leases: dict[str, Any]
) -> list[dict[str, Any]]:
    r = await client.post(f"/v1/{op}", json={"worker_id": worker, "leases": list(leases)})
    assert r.status_code == 200, r.text
    results: list[dict[str, Any]] = r.json()["results"]
    return results


def lease(job: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"job_id": job["id"], "lease_id": job["lease_id"], **extra}


async def get_job(client: httpx.AsyncClient, job_id: int) -> dict[str, Any]:
    r = await client.get(f"/v1/jobs/{job_id}")
    assert r.status_code == 200, r.text
    job: dict[str, Any] = r.json()
    return job
