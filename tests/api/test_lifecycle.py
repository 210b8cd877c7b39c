"""Every transition of the state diagram over HTTP, and each lease_lost case."""

from __future__ import annotations

import uuid

import httpx
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.api.helpers import claim, enqueue, get_job, lease, lease_call


async def test_enqueue_claim_complete(client: httpx.AsyncClient) -> None:
    job = await enqueue(client, queue="emails", type="welcome", payload={"user": 42}, priority=3)
    assert job["status"] == "pending" and job["attempts"] == 0 and job["max_attempts"] == 10
    assert job["payload"] == {"user": 42} and job["lease_seconds"] == 30

    [claimed] = await claim(client, queues=["emails"], max_jobs=10, lease_seconds=60)
    assert claimed["id"] == job["id"] and claimed["attempt"] == 1
    assert claimed["status"] == "running" and claimed["worker_id"] == "w1"
    assert uuid.UUID(claimed["lease_id"]) and claimed["lease_expires_at"] is not None
    assert claimed["checkpoint"] is None

    [res] = await lease_call(client, "complete", "w1", lease(claimed, result={"sent": True}))
    assert res == {**res, "job_id": job["id"], "ok": True, "status": "succeeded"}
    done = await get_job(client, job["id"])
    assert done["status"] == "succeeded" and done["result"] == {"sent": True}
    assert done["finished_at"] is not None and done["lease_expires_at"] is None


async def test_complete_twice_answers_same_success_without_second_transition(
    client: httpx.AsyncClient,
) -> None:
    await enqueue(client)
    [c] = await claim(client)
    first = await lease_call(client, "complete", "w1", lease(c, result=1))
    before = await get_job(client, c["id"])
    second = await lease_call(client, "complete", "w1", lease(c, result=2))
    after = await get_job(client, c["id"])
    assert first[0]["ok"] and second[0]["ok"] and second[0]["status"] == "succeeded"
    assert after["result"] == 1 and after["updated_at"] == before["updated_at"]


async def test_claim_respects_priority_then_age_and_max_jobs(client: httpx.AsyncClient) -> None:
    low = await enqueue(client, priority=0)
    high = await enqueue(client, priority=5)
    low2 = await enqueue(client, priority=0)
    got = await claim(client, max_jobs=2)
    assert [j["id"] for j in got] == [high["id"], low["id"]]
    rest = await claim(client, max_jobs=10)
    assert [j["id"] for j in rest] == [low2["id"]]
    assert await claim(client) == []


async def test_claim_across_queues_takes_best_overall(client: httpx.AsyncClient) -> None:
    a = await enqueue(client, queue="a", priority=1)
    b = await enqueue(client, queue="b", priority=9)
    await enqueue(client, queue="c", priority=100)  # not asked for
    got = await claim(client, queues=["a", "b", "a"], max_jobs=5)
    assert [j["id"] for j in got] == [b["id"], a["id"]]


async def test_delayed_job_is_not_claimed_before_due(
    client: httpx.AsyncClient, clean_db: AsyncEngine
) -> None:
    job = await enqueue(client, delay_seconds=3600)
    assert job["status"] == "scheduled"
    assert await claim(client) == []
    async with clean_db.begin() as conn:
        await conn.execute(text("UPDATE jobs SET run_at = now() - interval '1 s'"))
    # The promoter (on every instance) moves it to pending; a long-poll gets it then.
    assert [j["id"] for j in await claim(client, wait_seconds=5)] == [job["id"]]


async def test_heartbeat_extends_and_saves_checkpoint(client: httpx.AsyncClient) -> None:
    await enqueue(client)
    [c] = await claim(client, lease_seconds=5)
    [hb] = await lease_call(
        client,
        "heartbeat",
        "w1",
        lease(c, lease_seconds=600, checkpoint={"last_id": 800}, progress={"done": 8, "total": 20}),
    )
    assert hb["ok"] and hb["lease_expires_at"] > c["lease_expires_at"]
    job = await get_job(client, c["id"])
    assert job["checkpoint"] == {"last_id": 800} and job["progress"] == {"done": 8, "total": 20}
    assert job["checkpoint_at"] is not None
    # A heartbeat without a checkpoint keeps the saved one.
    await lease_call(client, "heartbeat", "w1", lease(c))
    assert (await get_job(client, c["id"]))["checkpoint"] == {"last_id": 800}


async def test_fail_retryable_goes_back_with_backoff_and_keeps_errors(
    client: httpx.AsyncClient,
) -> None:
    await enqueue(client, max_attempts=3)
    [c] = await claim(client)
    [res] = await lease_call(client, "fail", "w1", lease(c, error="SMTP 451", retryable=True))
    assert res["ok"] and res["status"] == "scheduled"  # waits out its backoff
    job = await get_job(client, c["id"])
    assert job["status"] in ("scheduled", "pending")  # the promoter may have moved it by now
    assert job["last_error"] == "SMTP 451" and job["errors"][-1]["error"] == "SMTP 451"
    assert job["errors"][-1]["attempt"] == 1
    assert job["run_at"] > c["run_at"]


async def test_fail_retry_after_seconds_overrides_backoff(client: httpx.AsyncClient) -> None:
    await enqueue(client)
    [c] = await claim(client)
    [res] = await lease_call(client, "fail", "w1", lease(c, error="later", retry_after_seconds=120))
    job = await get_job(client, c["id"])
    assert res["status"] == "scheduled" and job["status"] == "scheduled"
    assert job["run_at"] == res["run_at"]


async def test_fail_not_retryable_goes_dead(client: httpx.AsyncClient) -> None:
    await enqueue(client)
    [c] = await claim(client)
    [res] = await lease_call(client, "fail", "w1", lease(c, error="bad input", retryable=False))
    assert res["ok"] and res["status"] == "dead"
    job = await get_job(client, c["id"])
    assert job["status"] == "dead" and job["finished_at"] is not None


async def test_fail_on_last_attempt_goes_dead(
    client: httpx.AsyncClient, clean_db: AsyncEngine
) -> None:
    await enqueue(client, max_attempts=2)
    [c] = await claim(client)
    await lease_call(client, "fail", "w1", lease(c, error="e1", retry_after_seconds=0))
    [c2] = await claim(client)
    assert c2["attempt"] == 2
    [res] = await lease_call(client, "fail", "w1", lease(c2, error="e2"))
    assert res["status"] == "dead"
    job = await get_job(client, c["id"])
    assert [e["error"] for e in job["errors"]] == ["e1", "e2"]


async def test_error_history_is_bounded(client: httpx.AsyncClient, app: object) -> None:
    await enqueue(client, max_attempts=30)
    for i in range(25):
        [c] = await claim(client)
        await lease_call(client, "fail", "w1", lease(c, error=f"e{i}", retry_after_seconds=0))
    job = await get_job(client, c["id"])
    assert len(job["errors"]) == 20 and job["errors"][-1]["error"] == "e24"
    assert job["errors"][0]["error"] == "e5"


async def test_release_returns_without_charging_attempt_and_keeps_checkpoint(
    client: httpx.AsyncClient,
) -> None:
    await enqueue(client)
    [c] = await claim(client)
    [res] = await lease_call(client, "release", "w1", lease(c, checkpoint={"at": 5}))
    assert res["ok"] and res["status"] == "pending"
    [again] = await claim(client, worker="w2")
    assert again["attempt"] == 1 and again["checkpoint"] == {"at": 5}
    assert again["lease_id"] != c["lease_id"]


async def test_release_with_delay(client: httpx.AsyncClient) -> None:
    await enqueue(client)
    [c] = await claim(client)
    await lease_call(client, "release", "w1", lease(c, delay_seconds=600))
    assert (await get_job(client, c["id"]))["status"] == "scheduled"
    assert await claim(client) == []


async def test_cancel_pending_and_running(client: httpx.AsyncClient) -> None:
    pending = await enqueue(client)
    r = await client.post(f"/v1/jobs/{pending['id']}/cancel")
    assert r.status_code == 200 and r.json()["status"] == "cancelled"
    assert (await client.post(f"/v1/jobs/{pending['id']}/cancel")).status_code == 200

    await enqueue(client)
    [c] = await claim(client)
    r = await client.post(f"/v1/jobs/{c['id']}/cancel")
    assert r.status_code == 200 and r.json()["status"] == "cancelled"
    # The lease is invalid at once, and heartbeat says why.
    for op in ("heartbeat", "complete", "fail", "release"):
        [res] = await lease_call(client, op, "w1", lease(c))
        assert res["ok"] is False and res["error"] == "lease_lost" and res["cancelled"] is True
    assert (await get_job(client, c["id"]))["status"] == "cancelled"


async def test_cancel_finished_job_is_409(client: httpx.AsyncClient) -> None:
    await enqueue(client)
    [c] = await claim(client)
    await lease_call(client, "complete", "w1", lease(c))
    r = await client.post(f"/v1/jobs/{c['id']}/cancel")
    assert r.status_code == 409
    assert r.headers["content-type"].startswith("application/problem+json")
    assert r.json()["status"] == 409


async def test_retry_dead_cancelled_succeeded_and_409_otherwise(client: httpx.AsyncClient) -> None:
    pending = await enqueue(client)
    assert (await client.post(f"/v1/jobs/{pending['id']}/retry")).status_code == 409
    [c] = await claim(client)
    assert (await client.post(f"/v1/jobs/{c['id']}/retry")).status_code == 409  # running
    await lease_call(client, "fail", "w1", lease(c, retryable=False))
    r = await client.post(f"/v1/jobs/{c['id']}/retry")
    assert r.status_code == 200
    assert r.json()["status"] == "pending" and r.json()["attempts"] == 0

    [c2] = await claim(client)
    await lease_call(client, "complete", "w1", lease(c2))
    assert (await client.post(f"/v1/jobs/{c2['id']}/retry")).json()["status"] == "pending"
    await client.post(f"/v1/jobs/{c2['id']}/cancel")
    assert (await client.post(f"/v1/jobs/{c2['id']}/retry")).json()["status"] == "pending"
    # The old lease means nothing after a retry.
    [res] = await lease_call(client, "complete", "w1", lease(c2))
    assert res["ok"] is False


async def test_lease_lost_for_wrong_lease_or_wrong_worker(client: httpx.AsyncClient) -> None:
    await enqueue(client)
    [c] = await claim(client)
    bogus = {"job_id": c["id"], "lease_id": str(uuid.uuid4())}
    for op in ("heartbeat", "complete", "fail", "release"):
        [res] = await lease_call(client, op, "w1", bogus)
        assert res == {**res, "ok": False, "error": "lease_lost", "cancelled": False}
        [res] = await lease_call(client, op, "someone-else", lease(c))
        assert res["ok"] is False and res["error"] == "lease_lost"
    unknown = {"job_id": 999999, "lease_id": str(uuid.uuid4())}
    [res] = await lease_call(client, "complete", "w1", unknown)
    assert res["ok"] is False
    assert (await get_job(client, c["id"]))["status"] == "running"


async def test_batch_lease_calls_answer_per_item_in_order(client: httpx.AsyncClient) -> None:
    for _ in range(3):
        await enqueue(client)
    jobs = await claim(client, max_jobs=3)
    lost = {"job_id": jobs[1]["id"], "lease_id": str(uuid.uuid4())}
    results = await lease_call(client, "complete", "w1", lease(jobs[2]), lost, lease(jobs[0]))
    assert [(r["job_id"], r["ok"]) for r in results] == [
        (jobs[2]["id"], True),
        (jobs[1]["id"], False),
        (jobs[0]["id"], True),
    ]


async def test_expired_but_unreaped_lease_is_still_held(
    client: httpx.AsyncClient, clean_db: AsyncEngine
) -> None:
    await enqueue(client)
    [c] = await claim(client)
    async with clean_db.begin() as conn:
        await conn.execute(text("UPDATE jobs SET lease_expires_at = now() - interval '10 s'"))
    [hb] = await lease_call(client, "heartbeat", "w1", lease(c))
    assert hb["ok"] is True
    [res] = await lease_call(client, "complete", "w1", lease(c))
    assert res["ok"] is True
