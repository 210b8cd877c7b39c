"""Seeding jobs through the real HTTP API, and the dashboard steps the browser tests share."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import httpx
from playwright.async_api import Locator, Page, expect

WORKER = "browser-worker"


async def enqueue(
    api: httpx.AsyncClient, queue: str, *, type: str = "t", payload: Any = None, **fields: Any
) -> dict[str, Any]:
    """``POST /v1/jobs``; answers the created job."""
    r = await api.post(
        "/v1/jobs", json={"queue": queue, "type": type, "payload": payload, **fields}
    )
    assert r.status_code == 201, r.text
    job: dict[str, Any] = r.json()
    return job


async def enqueue_batch(
    api: httpx.AsyncClient, queue: str, payloads: Sequence[Any], *, type: str = "t", **fields: Any
) -> list[dict[str, Any]]:
    """``POST /v1/jobs/batch`` of one job per payload; answers the jobs in order."""
    body = {"jobs": [{"queue": queue, "type": type, "payload": p, **fields} for p in payloads]}
    r = await api.post("/v1/jobs/batch", json=body)
    assert r.status_code == 201, r.text
    jobs: list[dict[str, Any]] = r.json()["jobs"]
    assert [j["payload"] for j in jobs] == list(payloads)
    return jobs


async def enqueue_many(
    api: httpx.AsyncClient, queue: str, count: int, *, type: str = "t", **fields: Any
) -> list[dict[str, Any]]:
    """``count`` jobs in one batch, with payloads ``{"n": 0}`` to ``{"n": count - 1}``."""
    return await enqueue_batch(api, queue, [{"n": n} for n in range(count)], type=type, **fields)


async def claim(
    api: httpx.AsyncClient,
    queue: str,
    *,
    worker: str = WORKER,
    max_jobs: int = 1,
    wait_seconds: float = 0,
    lease_seconds: int = 300,
) -> list[dict[str, Any]]:
    """``POST /v1/claim`` for one queue; answers the leased jobs (empty when none was due)."""
    body = {
        "worker_id": worker,
        "queues": [queue],
        "max_jobs": max_jobs,
        "wait_seconds": wait_seconds,
        "lease_seconds": lease_seconds,
    }
    r = await api.post("/v1/claim", json=body, timeout=wait_seconds + 10)
    assert r.status_code == 200, r.text
    jobs: list[dict[str, Any]] = r.json()["jobs"]
    return jobs


async def lease_call(
    api: httpx.AsyncClient, op: str, worker: str, items: Sequence[dict[str, Any]]
) -> list[dict[str, Any]]:
    """``POST /v1/{op}`` (heartbeat, complete, fail, release); asserts every item was held."""
    r = await api.post(f"/v1/{op}", json={"worker_id": worker, "leases": list(items)})
    assert r.status_code == 200, r.text
    results: list[dict[str, Any]] = r.json()["results"]
    assert all(res["ok"] for res in results), results
    return results


def lease(job: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """The lease reference of a claimed job, with extra item fields."""
    return {"job_id": job["id"], "lease_id": job["lease_id"], **extra}


async def get_job(api: httpx.AsyncClient, job_id: int) -> dict[str, Any]:
    """``GET /v1/jobs/{id}``."""
    r = await api.get(f"/v1/jobs/{job_id}")
    assert r.status_code == 200, r.text
    job: dict[str, Any] = r.json()
    return job


async def queue_stats(api: httpx.AsyncClient, queue: str) -> dict[str, Any]:
    """This queue's entry in ``GET /v1/queues``."""
    r = await api.get("/v1/queues")
    assert r.status_code == 200, r.text
    queues: list[dict[str, Any]] = r.json()["queues"]
    (stats,) = [q for q in queues if q["name"] == queue]
    return stats


async def run_to_dead(
    api: httpx.AsyncClient,
    queue: str,
    failures: Sequence[tuple[str, str]],
    *,
    worker_api: httpx.AsyncClient | None = None,
    **fields: Any,
) -> dict[str, Any]:
    """A job that failed once per ``(worker, error)`` and is dead after the last; answers it.

    ``api`` enqueues it, ``worker_api`` (default ``api``) claims and fails it. It goes ahead of
    the queue's other jobs (priority 1000 unless given) and each failure asks for a retry at
    once, so each next claim (a long-poll) gets it back.
    """
    worker_api = worker_api or api
    fields.setdefault("priority", 1000)
    job = await enqueue(api, queue, max_attempts=len(failures), **fields)
    for worker, error in failures:
        (held,) = await claim(worker_api, queue, worker=worker, wait_seconds=5)
        assert held["id"] == job["id"]
        failure = lease(held, error=error, retry_after_seconds=0)
        await lease_call(worker_api, "fail", worker, [failure])
    dead = await get_job(api, job["id"])
    assert dead["status"] == "dead", dead
    return dead


async def sign_in(page: Page, key: str) -> None:
    """Signs in on the login page with ``key`` and waits for the overview."""
    await page.goto("/dashboard/login")
    await page.locator("#key").fill(key)
    await page.locator("#sign-in").click()
    await expect(page.locator("table#queues")).to_be_visible()


def queue_cell(page: Page, queue: str, column: str) -> Locator:
    """The overview's cell of ``column`` in the row of ``queue``."""
    return page.locator(f'table#queues tr[data-queue="{queue}"] td[data-col="{column}"]')
