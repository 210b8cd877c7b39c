"""A job's history (GET /v1/jobs/{id}/events): every transition, who made it, kept with the job.

Issue 20: the history was rebuilt from the job's current row, so earlier attempts' claims,
releases with their checkpoint and operators' retries were lost. Each test drives real
transitions through the API (and the reaper) and reads the history back.
"""

from __future__ import annotations

from typing import Any

import httpx
from fastapi import FastAPI
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.api.state import app_state
from tests.api.helpers import claim, enqueue, get_job, lease, lease_call


async def history(client: httpx.AsyncClient, job_id: int, **params: Any) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    after: str | None = None
    while True:
        query = {**params, **({"after": after} if after else {})}
        r = await client.get(f"/v1/jobs/{job_id}/events", params=query)
        assert r.status_code == 200, r.text
        page = r.json()
        events.extend(page["events"])
        after = page["next_cursor"]
        if after is None:
            return events


def kinds(events: list[dict[str, Any]]) -> list[str]:
    return [e["kind"] for e in events]


async def test_a_jobs_whole_life_is_told_in_order_with_its_actors(
    client: httpx.AsyncClient, clean_db: AsyncEngine
) -> None:
    job = await enqueue(client, queue="q", max_attempts=2)
    [first] = await claim(client, "w1", ["q"])
    await lease_call(client, "release", "w1", lease(first, checkpoint={"row": 40}))
    [second] = await claim(client, "w2", ["q"])
    error = {"type": "KeyError", "message": "'currency'", "traceback": "Traceback ...\nKeyError"}
    [failed] = await lease_call(
        client, "fail", "w2", lease(second, error=error, retry_after_seconds=0)
    )
    assert failed["status"] == "pending"
    [third] = await claim(client, "w3", ["q"])
    [dead] = await lease_call(client, "fail", "w3", lease(third, error="boom"))
    assert dead["status"] == "dead"
    r = await client.post(f"/v1/jobs/{job['id']}/retry")
    assert r.status_code == 200, r.text
    [fourth] = await claim(client, "w4", ["q"])
    await lease_call(client, "complete", "w4", lease(fourth, result=1))

    events = await history(client, job["id"])
    assert kinds(events) == [
        "enqueued",
        "claimed",
        "released",
        "claimed",
        "failed",
        "claimed",
        "failed",
        "retried",
        "claimed",
        "completed",
    ]
    claims = [e for e in events if e["kind"] == "claimed"]
    assert [(c["actor"], c["attempt"]) for c in claims] == [
        ("w1", 1),
        ("w2", 1),  # the release gave the attempt back
        ("w3", 2),
        ("w4", 1),  # the operator's retry reset the attempts
    ]
    assert all(c["instance"] for c in claims)
    released = events[2]
    assert released["data"]["checkpoint_saved"] is True
    assert released["data"]["status"] == "pending"
    structured = events[4]
    assert structured["data"]["type"] == "KeyError"
    assert structured["data"]["error"] == "'currency'"
    assert structured["data"]["traceback"].endswith("KeyError")
    assert structured["data"]["status"] == "pending"
    assert events[6]["data"]["status"] == "dead"
    assert events[7]["actor"] == "anonymous"
    assert events[7]["data"]["status_before"] == "dead"
    assert events[9]["actor"] == "w4" and events[9]["attempt"] == 1
    instants = [e["at"] for e in events]
    assert instants == sorted(instants)


async def test_history_pages_with_a_cursor_and_reads_the_same_as_one_page(
    client: httpx.AsyncClient, clean_db: AsyncEngine
) -> None:
    job = await enqueue(client, queue="q", max_attempts=10)
    for n in range(4):
        [held] = await claim(client, f"w{n}", ["q"])
        await lease_call(client, "fail", f"w{n}", lease(held, error=f"e{n}", retry_after_seconds=0))
    whole = await history(client, job["id"], limit=500)
    paged = await history(client, job["id"], limit=2)
    assert paged == whole
    assert kinds(whole) == ["enqueued"] + ["claimed", "failed"] * 4


async def test_an_expired_lease_and_an_operators_cancel_are_recorded(
    app: FastAPI, client: httpx.AsyncClient, clean_db: AsyncEngine
) -> None:
    job = await enqueue(client, queue="q", lease_seconds=1)
    [held] = await claim(client, "w1", ["q"])
    async with clean_db.begin() as conn:
        await conn.execute(
            text("UPDATE jobs SET lease_expires_at = now() - interval '1 second' WHERE id = :id"),
            {"id": job["id"]},
        )
    reaped = await app_state(app).running().services.upkeep.reap(batch_size=10)
    assert [r.id for r in reaped] == [job["id"]]
    r = await client.post(f"/v1/jobs/{job['id']}/cancel")
    assert r.status_code == 200, r.text
    events = await history(client, job["id"])
    assert kinds(events) == ["enqueued", "claimed", "lease_expired", "cancelled"]
    assert events[1]["actor"] == "w1"
    assert events[2]["data"]["status"] == "scheduled"
    assert events[2]["data"]["run_at"] is not None
    assert events[3]["data"] == {"status_before": "scheduled"}
    assert held["id"] == job["id"]


async def test_cancelling_a_running_job_records_its_attempt(
    client: httpx.AsyncClient, clean_db: AsyncEngine
) -> None:
    job = await enqueue(client, queue="q")
    await claim(client, "w1", ["q"])
    assert (await client.post(f"/v1/jobs/{job['id']}/cancel")).status_code == 200
    events = await history(client, job["id"])
    assert kinds(events) == ["enqueued", "claimed", "cancelled"]
    assert events[1]["actor"] == "w1"
    assert events[2]["data"]["status_before"] == "running"


async def test_progress_is_recorded_at_each_tenth_not_at_every_heartbeat(
    client: httpx.AsyncClient, clean_db: AsyncEngine
) -> None:
    job = await enqueue(client, queue="q")
    [held] = await claim(client, "w1", ["q"])
    for done in (0, 1, 1, 2, 7, 8, 8, 20, 20):
        [beat] = await lease_call(
            client, "heartbeat", "w1", lease(held, progress={"done": done, "total": 20})
        )
        assert beat["ok"]
    await lease_call(client, "heartbeat", "w1", lease(held, progress="half way"))
    await lease_call(client, "heartbeat", "w1", lease(held))
    events = await history(client, job["id"])
    progress = [e["data"]["progress"]["done"] for e in events if e["kind"] == "progress"]
    # 2/20 is the first tenth, 7/20 the third, 8/20 the fourth, 20/20 the tenth.
    assert progress == [2, 7, 8, 20]
    assert all(e["actor"] == "w1" for e in events if e["kind"] == "progress")


async def test_run_now_makes_a_retrying_job_due_and_says_who(
    client: httpx.AsyncClient, clean_db: AsyncEngine
) -> None:
    job = await enqueue(client, queue="q")
    [held] = await claim(client, "w1", ["q"])
    await lease_call(client, "fail", "w1", lease(held, error="x", retry_after_seconds=3600))
    assert (await get_job(client, job["id"]))["status"] == "scheduled"
    r = await client.post(f"/v1/jobs/{job['id']}/run-now")
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "pending"
    [again] = await claim(client, "w2", ["q"])
    assert again["id"] == job["id"]
    again_run = await client.post(f"/v1/jobs/{job['id']}/run-now")
    assert again_run.status_code == 409
    assert "scheduled" in again_run.json()["detail"]
    events = await history(client, job["id"])
    assert kinds(events) == ["enqueued", "claimed", "failed", "run_now", "claimed"]
    assert events[3]["actor"] == "anonymous"
    audit = (await client.get("/v1/audit", params={"action": "job.run_now"})).json()
    assert [(e["job_id"], e["state_before"], e["state_after"]) for e in audit["entries"]] == [
        (job["id"], "scheduled", "pending")
    ]


async def test_a_delayed_job_records_its_promotion(
    app: FastAPI, client: httpx.AsyncClient, clean_db: AsyncEngine
) -> None:
    job = await enqueue(client, queue="q", delay_seconds=3600)
    async with clean_db.begin() as conn:
        await conn.execute(
            text("UPDATE jobs SET run_at = now() - interval '1 second' WHERE id = :id"),
            {"id": job["id"]},
        )
    await app_state(app).running().services.upkeep.promote(batch_size=10)
    events = await history(client, job["id"])
    assert kinds(events) == ["enqueued", "promoted"]


async def test_history_is_deleted_with_its_job(
    client: httpx.AsyncClient, clean_db: AsyncEngine
) -> None:
    job = await enqueue(client, queue="q", max_attempts=1)
    [held] = await claim(client, "w1", ["q"])
    await lease_call(client, "fail", "w1", lease(held, error="x"))
    r = await client.post("/v1/jobs/bulk/delete", json={"queue": "q"})
    assert r.json()["changed"] == 1
    async with clean_db.connect() as conn:
        left = await conn.scalar(text("SELECT count(*) FROM job_events"))
    assert left == 0
    assert (await client.get(f"/v1/jobs/{job['id']}/events")).status_code == 404
    malformed = await client.get(f"/v1/jobs/{job['id']}/events", params={"after": "zz"})
    assert malformed.status_code == 422
    assert "query.after" in malformed.text


async def test_retrying_jobs_are_told_apart_from_jobs_scheduled_for_later(
    client: httpx.AsyncClient, clean_db: AsyncEngine
) -> None:
    later = await enqueue(client, queue="q", delay_seconds=3600)
    failing = await enqueue(client, queue="q")
    [held] = await claim(client, "w1", ["q"])
    assert held["id"] == failing["id"]
    await lease_call(client, "fail", "w1", lease(held, error="x", retry_after_seconds=3600))

    assert (await get_job(client, failing["id"]))["retrying"] is True
    assert (await get_job(client, later["id"]))["retrying"] is False
    retrying = (await client.get("/v1/jobs", params={"status": "retrying"})).json()["jobs"]
    assert [j["id"] for j in retrying] == [failing["id"]]
    scheduled = (await client.get("/v1/jobs", params={"status": "scheduled"})).json()["jobs"]
    assert {j["id"] for j in scheduled} == {failing["id"], later["id"]}
    [queue] = (await client.get("/v1/queues")).json()["queues"]
    assert (queue["scheduled"], queue["retrying"]) == (2, 1)
    preview = await client.post(
        "/v1/jobs/bulk/cancel", json={"status": "retrying", "dry_run": True}
    )
    assert preview.status_code == 200, preview.text
    assert preview.json()["changed"] == 1
    assert (await client.post(f"/v1/jobs/{failing['id']}/run-now")).status_code == 200
    assert (await get_job(client, failing["id"]))["retrying"] is False
    [queue] = (await client.get("/v1/queues")).json()["queues"]
    assert queue["retrying"] == 0


async def test_a_bulk_action_takes_the_state_it_names(
    client: httpx.AsyncClient, clean_db: AsyncEngine
) -> None:
    # Before issue 20 every bulk request naming a state was refused (422): strict mode took the
    # JSON text for a wrong type.
    job = await enqueue(client, queue="q")
    assert (await client.post(f"/v1/jobs/{job['id']}/cancel")).status_code == 200
    r = await client.post("/v1/jobs/bulk/retry", json={"status": "cancelled"})
    assert r.status_code == 200, r.text
    assert r.json()["changed"] == 1
    refused = await client.post("/v1/jobs/bulk/retry", json={"status": "running"})
    assert refused.status_code == 422
    assert "body.status" in refused.text
    unknown = await client.post("/v1/jobs/bulk/retry", json={"status": "nope"})
    assert unknown.status_code == 422
