"""Ops endpoints: queue counts, pause and resume, workers, health and readiness."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import httpx

from tests.api.helpers import claim, enqueue, lease, lease_call
from tests.polling import poll_until


async def test_pause_stops_claims_and_resume_restores_them(client: httpx.AsyncClient) -> None:
    job = await enqueue(client, queue="mail")
    r = await client.post("/v1/queues/mail/pause")
    assert r.status_code == 200 and r.json() == {
        "name": "mail",
        "paused": True,
        "callback_url": None,
    }
    assert await claim(client, queues=["mail"]) == []
    r = await client.post("/v1/queues/mail/resume")
    assert r.json()["paused"] is False
    assert [j["id"] for j in await claim(client, queues=["mail"])] == [job["id"]]


async def test_pausing_one_queue_leaves_others(client: httpx.AsyncClient) -> None:
    await enqueue(client, queue="a")
    b = await enqueue(client, queue="b")
    await client.post("/v1/queues/a/pause")
    assert [j["id"] for j in await claim(client, queues=["a", "b"], max_jobs=5)] == [b["id"]]


async def test_queue_counts(client: httpx.AsyncClient) -> None:
    await enqueue(client, queue="q")
    await enqueue(client, queue="q", delay_seconds=600)
    await enqueue(client, queue="q")
    [c] = await claim(client, queues=["q"])
    await enqueue(client, queue="r")
    stats = {q["name"]: q for q in (await client.get("/v1/queues")).json()["queues"]}
    assert set(stats) == {"q", "r"}
    q = stats["q"]
    assert (q["pending"], q["scheduled"], q["running"]) == (1, 1, 1)
    assert q["oldest_pending_age_seconds"] is not None and q["oldest_pending_age_seconds"] >= 0
    await lease_call(client, "complete", "w1", lease(c))
    q = {x["name"]: x for x in (await client.get("/v1/queues")).json()["queues"]}["q"]
    assert q["succeeded"] == 1 and q["succeeded_last_minute"] == 1


async def test_oldest_pending_age_is_the_oldest_among_every_priority(
    client: httpx.AsyncClient,
) -> None:
    """The age is read from the claim order's index, one head a priority (migration 0024): the
    oldest pending job need not be the next one claimed, nor in the first or last priority."""
    ages = {}
    for priority, seconds_ago in ((9, 50), (0, 300), (5, 100), (-3, 200)):
        run_at = (datetime.now(UTC) - timedelta(seconds=seconds_ago)).isoformat()
        job = await enqueue(client, queue="aged", priority=priority, run_at=run_at)
        ages[job["id"]] = seconds_ago

    async def oldest() -> float | None:
        queues = (await client.get("/v1/queues")).json()["queues"]
        age: float | None = {q["name"]: q for q in queues}["aged"]["oldest_pending_age_seconds"]
        return age

    age = await oldest()
    assert age is not None and 300 <= age < 360
    [first] = await claim(client, queues=["aged"])  # priority 9: not the oldest
    assert ages[first["id"]] == 50
    age = await oldest()
    assert age is not None and 300 <= age < 360
    await client.post(f"/v1/jobs/{next(i for i, s in ages.items() if s == 300)}/cancel")
    age = await oldest()
    assert age is not None and 200 <= age < 260  # now priority -3's, the last head
    for _ in range(2):
        await claim(client, queues=["aged"])
    assert await oldest() is None  # nothing pending


async def test_workers_lists_who_holds_what(client: httpx.AsyncClient) -> None:
    for _ in range(3):
        await enqueue(client)
    a = await claim(client, worker="host-a:1", max_jobs=2)
    b = await claim(client, worker="host-b:2", max_jobs=2)
    workers = {w["worker_id"]: w for w in (await client.get("/v1/workers")).json()["workers"]}
    assert workers["host-a:1"]["job_ids"] == sorted(j["id"] for j in a)
    assert workers["host-b:2"]["jobs_held"] == len(b) == 1


async def test_pause_validates_queue_name(client: httpx.AsyncClient) -> None:
    r = await client.post("/v1/queues/%20bad/pause")
    assert r.status_code == 422 and r.json()["errors"][0]["field"] == "path.name"


async def test_health_and_readiness(client: httpx.AsyncClient) -> None:
    assert (await client.get("/healthz")).json() == {"status": "ok"}
    assert (await client.get("/readyz")).json() == {"status": "ok"}


async def test_metrics_show_waiting_claims_and_loop_health(client: httpx.AsyncClient) -> None:
    waiting = asyncio.create_task(claim(client, queues=["idle"], wait_seconds=10))

    async def one_waiting() -> bool:
        return "jobq_claims_waiting 1.0" in (await client.get("/metrics")).text

    await poll_until(one_waiting, within=5, what="the claim to park")
    scrape = (await client.get("/metrics")).text
    assert 'jobq_loop_stalled{loop="promoter"} 0.0' in scrape
    assert 'jobq_loop_consecutive_failures{loop="backstop"} 0.0' in scrape
    assert 'jobq_statements_total{kind="claim"}' in scrape
    await enqueue(client, queue="idle")
    assert len(await asyncio.wait_for(waiting, 5)) == 1
