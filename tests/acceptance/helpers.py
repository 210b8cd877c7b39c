"""HTTP and database helpers shared by the acceptance tests."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import httpx
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine


async def enqueue_batch(
    client: httpx.AsyncClient, queue: str, payloads: Sequence[Any]
) -> list[dict[str, Any]]:
    """Enqueues one job per payload through ``POST /v1/jobs/batch``; answers the jobs in order."""
    body = {"jobs": [{"queue": queue, "type": "acceptance", "payload": p} for p in payloads]}
    r = await client.post("/v1/jobs/batch", json=body)
    assert r.status_code == 201, r.text
    jobs: list[dict[str, Any]] = r.json()["jobs"]
    assert [j["payload"] for j in jobs] == list(payloads)
    assert all(j["status"] == "pending" and j["attempts"] == 0 for j in jobs)
    return jobs


async def claim(
    client: httpx.AsyncClient, worker_id: str, queue: str, **fields: Any
) -> list[dict[str, Any]]:
    """``POST /v1/claim``; answers the leased jobs (asserting a 200)."""
    r = await client.post("/v1/claim", json={"worker_id": worker_id, "queues": [queue], **fields})
    assert r.status_code == 200, r.text
    jobs: list[dict[str, Any]] = r.json()["jobs"]
    return jobs


async def lease_call(
    client: httpx.AsyncClient, op: str, worker_id: str, leases: Sequence[dict[str, Any]]
) -> list[dict[str, Any]]:
    """``POST /v1/{op}`` (heartbeat, complete, fail, release); answers the per-lease results."""
    r = await client.post(f"/v1/{op}", json={"worker_id": worker_id, "leases": list(leases)})
    assert r.status_code == 200, r.text
    results: list[dict[str, Any]] = r.json()["results"]
    assert [res["job_id"] for res in results] == [item["job_id"] for item in leases]
    return results


def lease(job: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """The lease reference of a claimed job, with extra item fields."""
    return {"job_id": job["id"], "lease_id": job["lease_id"], **extra}


async def job_rows(engine: AsyncEngine) -> dict[int, dict[str, Any]]:
    """Every row of ``jobs`` (the columns the tests look at), by id."""
    async with engine.connect() as conn:
        result = await conn.execute(
            text(
                "SELECT id, status, attempts, worker_id, lease_id, result, finished_at, errors "
                "FROM jobs ORDER BY id"
            )
        )
        return {row["id"]: dict(row) for row in result.mappings()}


def requests_served(metrics: str, route: str) -> int:
    """The POSTs to ``route`` a server answered, from the counts of its request histogram
    (``/metrics``)."""
    return sum(
        int(float(line.rsplit(" ", 1)[1]))
        for line in metrics.splitlines()
        if line.startswith("jobq_http_server_request_duration_seconds_count{")
        and f'route="{route}"' in line
        and 'method="POST"' in line
    )
