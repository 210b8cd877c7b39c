"""Who works on what (GET /v1/workers), why a pending job is not running (GET .../blockers), and
whether a running job's progress moves (issue 20)."""

from __future__ import annotations

import httpx
from fastapi import FastAPI
from sqlalchemy.ext.asyncio import AsyncEngine

from app.api.state import app_state
from tests.api.helpers import claim, enqueue, get_job, lease, lease_call
from tests.keys import Keys, bearer


async def flush(app: FastAPI) -> None:
    """Writes the sightings now, as the sightings loop does every few seconds."""
    await app_state(app).running().services.workers.flush()


async def workers(client: httpx.AsyncClient, **headers: str) -> dict[str, dict[str, object]]:
    r = await client.get("/v1/workers", headers=headers)
    assert r.status_code == 200, r.text
    return {w["worker_id"]: w for w in r.json()["workers"]}


async def blockers(client: httpx.AsyncClient, job_id: int) -> list[tuple[str, str]]:
    r = await client.get(f"/v1/jobs/{job_id}/blockers")
    assert r.status_code == 200, r.text
    return [(b["kind"], b["message"]) for b in r.json()["blockers"]]


async def test_an_idle_long_polling_worker_is_listed_with_its_queues(
    app: FastAPI, client: httpx.AsyncClient, clean_db: AsyncEngine
) -> None:
    assert await claim(client, "idle-1", ["emails", "sms"], wait_seconds=0.2) == []
    job = await enqueue(client, queue="reports", type="monthly")
    [held] = await claim(client, "busy-1", ["reports"])
    await flush(app)
    listed = await workers(client)
    idle, busy = listed["idle-1"], listed["busy-1"]
    assert idle["live"] is True and idle["jobs_held"] == 0
    assert idle["queues"] == ["emails", "sms"]
    assert idle["first_seen_at"] is not None and idle["instance"]
    assert busy["jobs_held"] == 1 and busy["job_ids"] == [job["id"]]
    assert busy["job_types"] == ["monthly"] and len(busy["job_started_at"]) == 1
    assert list(listed) == ["busy-1", "idle-1"]  # busy ones first
    assert held["id"] == job["id"]


async def test_a_pending_job_says_what_holds_it_back(
    app: FastAPI, client: httpx.AsyncClient, clean_db: AsyncEngine
) -> None:
    lonely = await enqueue(client, queue="nobody-polls")
    assert await blockers(client, lonely["id"]) == [
        (
            "no_worker",
            "no live worker polls queue nobody-polls (none seen claiming in the last 60 s)",
        )
    ]
    r = await client.put(
        "/v1/limits", json={"scope": "key", "pattern": "customer:*", "max_running": 2}
    )
    assert r.status_code == 201, r.text
    jobs = [await enqueue(client, queue="sync", concurrency_key="customer:42") for _ in range(3)]
    taken = await claim(client, "w1", ["sync"], max_jobs=3)
    assert len(taken) == 2
    await flush(app)
    [waiting] = [j for j in jobs if j["id"] not in {t["id"] for t in taken}]
    assert await blockers(client, waiting["id"]) == [("key_limit", "key customer:42 at 2/2")]
    assert await blockers(client, taken[0]["id"]) == []  # running: nothing to explain
    assert (await client.post("/v1/queues/sync/pause")).status_code == 200
    kinds = [kind for kind, _ in await blockers(client, waiting["id"])]
    assert kinds == ["queue_paused", "key_limit"]
    assert (await client.get("/v1/jobs/999999/blockers")).status_code == 404


async def test_blockers_and_workers_respect_key_scopes(
    app: FastAPI, client: httpx.AsyncClient, clean_db: AsyncEngine, keys: Keys
) -> None:
    mail = await client.post(
        "/v1/jobs", json={"queue": "mail", "type": "t"}, headers=bearer(keys.admin)
    )
    r = await client.post(
        "/v1/claim",
        json={"worker_id": "both", "queues": ["mail", "billing.eu"], "wait_seconds": 0},
        headers=bearer(keys.worker),
    )
    assert r.status_code == 200
    await flush(app)
    seen = await workers(client, **bearer(keys.scoped_viewer))
    assert seen["both"]["queues"] == ["billing.eu"]  # not the other team's queue
    assert seen["both"]["job_ids"] == []
    outside = await client.get(
        f"/v1/jobs/{mail.json()['id']}/blockers", headers=bearer(keys.scoped_viewer)
    )
    assert outside.status_code == 403


async def test_progress_at_moves_with_progress_or_checkpoint_not_with_every_heartbeat(
    client: httpx.AsyncClient, clean_db: AsyncEngine
) -> None:
    job = await enqueue(client, queue="q")
    [held] = await claim(client, "w1", ["q"])
    assert (await get_job(client, job["id"]))["progress_at"] is None
    await lease_call(client, "heartbeat", "w1", lease(held, progress={"done": 1, "total": 9}))
    first = (await get_job(client, job["id"]))["progress_at"]
    assert first is not None
    await lease_call(client, "heartbeat", "w1", lease(held, progress={"done": 1, "total": 9}))
    await lease_call(client, "heartbeat", "w1", lease(held))
    assert (await get_job(client, job["id"]))["progress_at"] == first
    await lease_call(client, "heartbeat", "w1", lease(held, checkpoint={"row": 5}))
    assert (await get_job(client, job["id"]))["progress_at"] > first
