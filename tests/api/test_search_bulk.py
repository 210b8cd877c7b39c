"""Job search (payload containment, time range) and bulk actions over HTTP, on a real database."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.api.helpers import claim, enqueue, get_job, lease, lease_call


async def _ids(client: httpx.AsyncClient, **params: Any) -> list[int]:
    r = await client.get("/v1/jobs", params=params)
    assert r.status_code == 200, r.text
    return [j["id"] for j in r.json()["jobs"]]


async def _dead(client: httpx.AsyncClient, queue: str, **fields: Any) -> dict[str, Any]:
    job = await enqueue(client, queue=queue, max_attempts=1, **fields)
    [held] = await claim(client, queues=[queue])
    [result] = await lease_call(client, "fail", "w1", lease(held, error="boom"))
    assert result["status"] == "dead", result
    return job


async def test_payload_containment_finds_exactly_the_matching_jobs(
    client: httpx.AsyncClient,
) -> None:
    wanted = [
        await enqueue(client, queue="mail", payload={"user": 42, "kind": "welcome"}),
        await enqueue(client, queue="sms", payload={"user": 42, "tags": ["a", "b"]}),
    ]
    for other in ({"user": 7}, {"user": "42"}, {"account": {"user": 42}}, [42], None):
        await enqueue(client, queue="mail", payload=other)
    expected = sorted((j["id"] for j in wanted), reverse=True)
    assert await _ids(client, payload='{"user": 42}') == expected
    assert await _ids(client, payload='{"user": 42}', queue="sms") == [wanted[1]["id"]]
    assert await _ids(client, payload='{"tags": ["b"]}') == [wanted[1]["id"]]
    assert await _ids(client, payload='{"user": 42}', status="running") == []
    # A scalar matches itself and arrays holding it (jsonb's @>): here the job of [42] too.
    scalar = await enqueue(client, queue="mail", payload=42)
    found = await _ids(client, payload="42")
    assert found[0] == scalar["id"] and len(found) == 2
    # Nested containment, and paging through the matches by cursor.
    nested = await enqueue(client, queue="mail", payload={"account": {"user": 43}})
    assert await _ids(client, payload='{"account": {"user": 43}}') == [nested["id"]]
    r = await client.get("/v1/jobs", params={"payload": '{"user": 42}', "limit": 1})
    page = r.json()
    assert [j["id"] for j in page["jobs"]] == expected[:1] and page["next_cursor"]
    rest = await _ids(client, payload='{"user": 42}', limit=1, after=page["next_cursor"])
    assert rest == expected[1:]


async def test_a_bad_payload_filter_is_a_422_naming_it(client: httpx.AsyncClient) -> None:
    for bad in ("{user: 42}", '{"a": 1, "a": 2}', "NaN", '{"a": ', "x" * 5000):
        r = await client.get("/v1/jobs", params={"payload": bad})
        assert r.status_code == 422, (bad, r.text)
        assert r.headers["content-type"].startswith("application/problem+json")
        assert r.json()["errors"][0]["field"] == "query.payload"


async def test_time_range_search(client: httpx.AsyncClient, clean_db: AsyncEngine) -> None:
    old = await enqueue(client, queue="t")
    new = await enqueue(client, queue="t")
    async with clean_db.begin() as conn:
        await conn.execute(
            text("UPDATE jobs SET created_at = now() - interval '2 hours' WHERE id = :id"),
            {"id": old["id"]},
        )
    hour_ago = (datetime.now(UTC) - timedelta(hours=1)).isoformat()
    assert await _ids(client, created_before=hour_ago) == [old["id"]]
    assert await _ids(client, created_after=hour_ago) == [new["id"]]
    assert await _ids(client, created_after=hour_ago, queue="t", status="pending") == [new["id"]]
    r = await client.get("/v1/jobs", params={"created_after": "2030-01-01T00:00:00"})
    assert r.status_code == 422 and r.json()["errors"][0]["field"] == "query.created_after"


async def test_bulk_retry_takes_the_dead_of_one_queue_and_type(client: httpx.AsyncClient) -> None:
    mine = [await _dead(client, "q", type="resize") for _ in range(3)]
    other_type = await _dead(client, "q", type="crop")
    other_queue = await _dead(client, "r", type="resize")
    pending = await enqueue(client, queue="q", type="resize")
    body = {"queue": "q", "type": "resize"}
    r = await client.post("/v1/jobs/bulk/retry", json={**body, "dry_run": True})
    assert r.status_code == 200, r.text
    assert r.json() == {"action": "retry", "dry_run": True, "changed": 3, "batches": 0}
    assert [(await get_job(client, j["id"]))["status"] for j in mine] == ["dead"] * 3

    r = await client.post("/v1/jobs/bulk/retry", json=body)
    assert r.json() == {"action": "retry", "dry_run": False, "changed": 3, "batches": 1}
    for job in mine:
        again = await get_job(client, job["id"])
        assert (again["status"], again["attempts"]) == ("pending", 0)
    assert (await get_job(client, other_type["id"]))["status"] == "dead"
    assert (await get_job(client, other_queue["id"]))["status"] == "dead"
    assert (await get_job(client, pending["id"]))["status"] == "pending"
    # The retried jobs are claimable again, and a repeat changes nothing.
    assert len(await claim(client, queues=["q"], max_jobs=10)) == 4
    r = await client.post("/v1/jobs/bulk/retry", json=body)
    assert r.json()["changed"] == 0

    entry = (await client.get("/v1/audit", params={"action": "bulk.retry"})).json()["entries"]
    assert entry[0]["detail"] == {"search": body, "jobs": 0, "batches": 0}
    assert entry[0]["outcome"] == "unchanged"
    assert entry[1]["detail"] == {"search": body, "jobs": 3, "batches": 1}
    assert (entry[1]["outcome"], entry[1]["queue"], entry[1]["actor"]) == (
        "changed",
        "q",
        "anonymous",
    )


async def test_bulk_actions_refuse_states_they_do_not_take(client: httpx.AsyncClient) -> None:
    job = await enqueue(client, queue="q")
    for action, status in (("cancel", "running"), ("cancel", "dead"), ("retry", "pending")):
        r = await client.post(f"/v1/jobs/bulk/{action}", json={"status": status})
        assert r.status_code == 422, r.text
        assert r.json()["errors"][0]["field"] == "body.status"
    for action, status in (("delete", "pending"), ("delete", "running")):
        r = await client.post(f"/v1/jobs/bulk/{action}", json={"status": status})
        assert r.status_code == 422
    r = await client.post("/v1/jobs/bulk/explode", json={})
    assert r.status_code == 422 and r.json()["errors"][0]["field"] == "path.action"
    r = await client.post("/v1/jobs/bulk/cancel", json={"queue": "q", "surprise": 1})
    assert r.status_code == 422
    assert (await get_job(client, job["id"]))["status"] == "pending"


async def test_bulk_cancel_by_payload_leaves_running_and_other_jobs(
    client: httpx.AsyncClient,
) -> None:
    running = await enqueue(client, queue="q", payload={"tenant": "a"})
    await claim(client, queues=["q"])
    scheduled = await enqueue(client, queue="q", payload={"tenant": "a"}, delay_seconds=600)
    pending = await enqueue(client, queue="q", payload={"tenant": "a", "n": 1})
    other = await enqueue(client, queue="q", payload={"tenant": "b"})
    r = await client.post("/v1/jobs/bulk/cancel", json={"payload": {"tenant": "a"}})
    assert r.json()["changed"] == 2
    states = {
        j["id"]: (await get_job(client, j["id"]))["status"]
        for j in (running, scheduled, pending, other)
    }
    assert states == {
        running["id"]: "running",
        scheduled["id"]: "cancelled",
        pending["id"]: "cancelled",
        other["id"]: "pending",
    }


async def test_bulk_delete_removes_finished_jobs_only(client: httpx.AsyncClient) -> None:
    dead = await _dead(client, "q")
    cancelled = await enqueue(client, queue="q")
    await client.post(f"/v1/jobs/{cancelled['id']}/cancel")
    live = await enqueue(client, queue="q")
    r = await client.post("/v1/jobs/bulk/delete", json={"queue": "q", "dry_run": True})
    assert r.json()["changed"] == 2
    r = await client.post("/v1/jobs/bulk/delete", json={"queue": "q"})
    assert r.json()["changed"] == 2
    for gone in (dead, cancelled):
        assert (await client.get(f"/v1/jobs/{gone['id']}")).status_code == 404
    assert (await get_job(client, live["id"]))["status"] == "pending"
    [stats] = (await client.get("/v1/queues")).json()["queues"]
    assert (stats["pending"], stats["dead"], stats["cancelled"]) == (1, 0, 0)


async def _insert(engine: AsyncEngine, count: int, *, queue: str, status: str) -> None:
    finished = "now()" if status in ("succeeded", "dead", "cancelled") else "NULL"
    async with engine.begin() as conn:
        await conn.execute(
            text(
                "INSERT INTO jobs (queue, type, payload, status, max_attempts, lease_seconds, "
                f"finished_at) SELECT :queue, 't', jsonb_build_object('n', g), :status, 3, 30, "
                f"{finished} FROM generate_series(1, :count) g"
            ),
            {"queue": queue, "status": status, "count": count},
        )
        # Statistics, as a table that has lived has them: the plans are chosen from them.
        await conn.execute(text("ANALYZE jobs"))


async def test_bulk_cancel_of_50000_jobs_runs_in_bounded_batches_with_the_exact_count(
    client: httpx.AsyncClient, clean_db: AsyncEngine
) -> None:
    await _insert(clean_db, 50_000, queue="big", status="pending")
    await _insert(clean_db, 1_000, queue="keep", status="pending")
    r = await client.post("/v1/jobs/bulk/cancel", json={"queue": "big", "dry_run": True})
    assert r.json()["changed"] == 50_000
    r = await client.post("/v1/jobs/bulk/cancel", json={"queue": "big"})
    # 1,000 jobs a statement (JOBQ_BULK_BATCH_SIZE's default): fifty batches, no more.
    assert r.json() == {"action": "cancel", "dry_run": False, "changed": 50_000, "batches": 50}
    async with clean_db.connect() as conn:
        rows = dict(
            (
                await conn.execute(
                    text("SELECT queue || ':' || status, count(*) FROM jobs GROUP BY 1")
                )
            ).all()
        )
    assert rows == {"big:cancelled": 50_000, "keep:pending": 1_000}
    stats = {q["name"]: q for q in (await client.get("/v1/queues")).json()["queues"]}
    assert (stats["big"]["pending"], stats["big"]["cancelled"]) == (0, 50_000)
    assert stats["keep"]["pending"] == 1_000
    [entry] = (await client.get("/v1/audit", params={"action": "bulk.cancel"})).json()["entries"]
    assert entry["detail"] == {"search": {"queue": "big"}, "jobs": 50_000, "batches": 50}
    # Deleting them, too, is exact.
    r = await client.post("/v1/jobs/bulk/delete", json={"queue": "big"})
    assert r.json()["changed"] == 50_000


async def test_bulk_cancel_racing_claims_counts_each_job_once(
    client: httpx.AsyncClient, clean_db: AsyncEngine
) -> None:
    await _insert(clean_db, 5_000, queue="race", status="pending")
    claimed: list[int] = []

    async def worker() -> None:
        while True:
            jobs = await claim(client, queues=["race"], max_jobs=50)
            if not jobs:
                return
            claimed.extend(j["id"] for j in jobs)

    workers = [asyncio.create_task(worker()) for _ in range(2)]
    r = await client.post("/v1/jobs/bulk/cancel", json={"queue": "race"})
    await asyncio.gather(*workers)
    cancelled = r.json()["changed"]
    async with clean_db.connect() as conn:
        counts = dict(
            (await conn.execute(text("SELECT status, count(*) FROM jobs GROUP BY status"))).all()
        )
    assert counts.get("cancelled", 0) == cancelled
    assert counts.get("running", 0) == len(claimed) == len(set(claimed))
    assert cancelled + len(claimed) == 5_000


async def test_scoped_admin_bulk_acts_only_in_its_queues(
    client: httpx.AsyncClient, clean_db: AsyncEngine
) -> None:
    # Covered with keys in tests/api/test_auth_*.py; here: naming a queue keeps the action in it.
    await _insert(clean_db, 10, queue="a", status="pending")
    await _insert(clean_db, 10, queue="b", status="pending")
    r = await client.post("/v1/jobs/bulk/cancel", json={"queue": "a"})
    assert r.json()["changed"] == 10
    stats = {q["name"]: q for q in (await client.get("/v1/queues")).json()["queues"]}
    assert (stats["a"]["cancelled"], stats["b"]["pending"]) == (10, 10)


async def test_queues_show_each_minute_of_the_last_hour(client: httpx.AsyncClient) -> None:
    for _ in range(2):
        await enqueue(client, queue="m")
    held = await claim(client, queues=["m"], max_jobs=2)
    await lease_call(client, "complete", "w1", lease(held[0]))
    await lease_call(client, "fail", "w1", lease(held[1], error="x"))
    await _dead(client, "m")
    [stats] = (await client.get("/v1/queues")).json()["queues"]
    minutes = stats["last_hour"]
    assert 1 <= len(minutes) <= 2  # the work may straddle a minute boundary
    total = {k: sum(m[k] for m in minutes) for k in ("succeeded", "failed", "dead", "cancelled")}
    assert total == {"succeeded": 1, "failed": 1, "dead": 1, "cancelled": 0}


async def test_workers_name_the_instance_and_each_lease_expiry(client: httpx.AsyncClient) -> None:
    for _ in range(2):
        await enqueue(client, queue="w")
    held = await claim(client, "box-1", queues=["w"], max_jobs=2)
    [worker] = (await client.get("/v1/workers")).json()["workers"]
    assert worker["worker_id"] == "box-1" and worker["jobs_held"] == 2
    assert worker["job_ids"] == sorted(j["id"] for j in held)
    assert len(worker["lease_expiries"]) == 2
    assert worker["next_lease_expiry"] == min(worker["lease_expiries"])
    assert worker["instance"] and ":" in worker["instance"]
    assert worker["last_seen_at"] is not None
