"""Small HTTP helpers shared by the API tests."""

from __future__ import annotations

from typing import Any

import httpx


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
