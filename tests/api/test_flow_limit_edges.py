"""Limits at their edges, as an outside audit found them: a full key must never hold up other
keys' jobs (on one queue or several, whatever state the limit rows are in), a producer of one
queue must not use up another queue's key slots, a raised limit wakes parked claims at once, and
the listing counts a key under the one limit that applies to it."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
from fastapi import FastAPI
from sqlalchemy.ext.asyncio import AsyncEngine

from app.api.state import app_state
from app.auth.keys import Role
from tests.api.helpers import claim, enqueue, lease, lease_call, running_app
from tests.keys import bearer, make_key
from tests.polling import poll_until


async def set_limit(client: httpx.AsyncClient, **body: Any) -> dict[str, Any]:
    r = await client.put("/v1/limits", json=body)
    assert r.status_code in (200, 201), r.text
    limit: dict[str, Any] = r.json()
    return limit


async def test_a_full_key_in_one_queue_does_not_starve_a_claim_on_several(
    client: httpx.AsyncClient,
) -> None:
    await set_limit(client, scope="key", pattern="hot", max_running=1)
    for _ in range(20):
        await enqueue(client, queue="a", concurrency_key="hot")
    plain = await enqueue(client, queue="b")
    [held] = await claim(client, queues=["a"])
    assert held["concurrency_key"] == "hot"
    # The head of "a" is hot's, all of it over the limit: the claim must reach "b".
    [got] = await claim(client, queues=["a", "b"], max_jobs=1)
    assert got["id"] == plain["id"]


async def test_a_full_key_does_not_shrink_a_claim_on_several_queues(
    client: httpx.AsyncClient,
) -> None:
    await set_limit(client, scope="key", pattern="hot", max_running=1)
    for _ in range(20):
        await enqueue(client, queue="a", concurrency_key="hot")
    plain = [await enqueue(client, queue="b") for _ in range(3)]
    got = await claim(client, queues=["a", "b"], max_jobs=5)
    # One hot job (its one slot) and every job of "b".
    assert sorted(j["id"] for j in got if j["queue"] == "b") == [p["id"] for p in plain]
    assert [j["concurrency_key"] for j in got if j["queue"] == "a"] == ["hot"]


async def test_re_applying_a_limit_leaves_a_busy_key_unable_to_block_its_queue(
    client: httpx.AsyncClient,
) -> None:
    limit = {"scope": "key", "pattern": "k", "max_running": 1}
    await set_limit(client, **limit)
    keyed = [await enqueue(client, concurrency_key="k") for _ in range(20)]
    plain = [await enqueue(client) for _ in range(5)]
    [first] = await claim(client, max_jobs=1)
    assert first["id"] == keyed[0]["id"]
    [second] = await claim(client, max_jobs=1)
    assert second["id"] == plain[0]["id"]
    # A deploy re-applies its limits from config: the same limit again.
    await set_limit(client, **limit)
    [third] = await claim(client, max_jobs=1)
    assert third["id"] == plain[1]["id"]
    # A long poll too, at once (a job is there).
    [fourth] = await claim(client, max_jobs=1, wait_seconds=3)
    assert fourth["id"] == plain[2]["id"]


async def test_re_applying_a_rate_limit_leaves_an_empty_bucket_unable_to_block_its_queue(
    client: httpx.AsyncClient,
) -> None:
    limit = {"scope": "key", "pattern": "k", "rate": {"limit": 1, "per_seconds": 3600}}
    await set_limit(client, **limit)
    keyed = [await enqueue(client, concurrency_key="k") for _ in range(20)]
    plain = [await enqueue(client) for _ in range(3)]
    [first] = await claim(client, max_jobs=1)
    assert first["id"] == keyed[0]["id"]
    await set_limit(client, **limit)
    [second] = await claim(client, max_jobs=1)
    assert second["id"] == plain[0]["id"]


async def test_a_claim_takes_every_eligible_job_behind_a_full_key(
    client: httpx.AsyncClient,
) -> None:
    await set_limit(client, scope="key", pattern="k", max_running=1)
    keyed = [await enqueue(client, concurrency_key="k") for _ in range(20)]
    plain = [await enqueue(client) for _ in range(5)]
    # What a claim without the key would take: one of k (its slot) and all five others.
    got = await claim(client, max_jobs=6)
    assert sorted(j["id"] for j in got) == sorted([keyed[0]["id"]] + [p["id"] for p in plain])


async def test_a_producer_of_one_queue_cannot_use_up_another_queues_key_slots(
    app: FastAPI, client: httpx.AsyncClient, clean_db: AsyncEngine
) -> None:
    admin = await make_key(clean_db, "admin", Role.ADMIN)
    worker = await make_key(clean_db, "worker", Role.WORKER)
    team_a = await make_key(clean_db, "team-a", Role.PRODUCER, ["a"])
    team_b = await make_key(clean_db, "team-b", Role.PRODUCER, ["b"])
    await app_state(app).running().keys.refresh()

    r = await client.put(
        "/v1/limits",
        json={"scope": "key", "pattern": "customer:*", "max_running": 1},
        headers=bearer(admin),
    )
    assert r.status_code == 201, r.text
    # Team a floods the key that team b's jobs depend on, and its worker holds the slot.
    for _ in range(3):
        r = await client.post(
            "/v1/jobs",
            json={"queue": "a", "type": "t", "concurrency_key": "customer:42"},
            headers=bearer(team_a),
        )
        assert r.status_code == 201, r.text
    r = await client.post(
        "/v1/jobs",
        json={"queue": "b", "type": "t", "concurrency_key": "customer:42"},
        headers=bearer(team_b),
    )
    assert r.status_code == 201, r.text
    b_job = r.json()

    async def take(queue: str) -> list[dict[str, Any]]:
        r = await client.post(
            "/v1/claim",
            json={"worker_id": f"w-{queue}", "queues": [queue], "max_jobs": 5},
            headers=bearer(worker),
        )
        assert r.status_code == 200, r.text
        jobs: list[dict[str, Any]] = r.json()["jobs"]
        return jobs

    assert len(await take("a")) == 1  # the limit holds within queue a
    [got] = await take("b")  # and queue b's job of the same key is not delayed by it
    assert got["id"] == b_job["id"]
    assert await take("b") == []


async def test_raising_a_key_limit_wakes_a_parked_claim_at_once(
    database_url: str, clean_db: AsyncEngine
) -> None:
    # The backstop is far longer than the wait: only a wake-up can answer the parked claim.
    async with running_app(database_url) as client:
        await set_limit(client, scope="key", pattern="k", max_running=1)
        jobs = [await enqueue(client, concurrency_key="k") for _ in range(2)]
        [held] = await claim(client, max_jobs=1)
        assert held["id"] == jobs[0]["id"]
        parked = asyncio.create_task(claim(client, "w2", max_jobs=1, wait_seconds=10))
        service = app_state(client.app).running().services  # type: ignore[attr-defined]
        await poll_until(
            lambda: service.jobs.hub.parked == 1, what="the claim to park", interval=0.01
        )
        await set_limit(client, scope="key", pattern="k", max_running=2)
        [woken] = await asyncio.wait_for(parked, 8)
        assert woken["id"] == jobs[1]["id"]
        [done] = await lease_call(client, "complete", "w1", lease(held))
        assert done["ok"]


async def test_the_listing_counts_a_key_under_the_limit_that_applies_to_it(
    client: httpx.AsyncClient,
) -> None:
    await set_limit(client, scope="key", pattern="cust:*", max_running=5)
    await set_limit(client, scope="key", pattern="cust:4*", max_running=5)
    await enqueue(client, concurrency_key="cust:42")
    await enqueue(client, concurrency_key="cust:42")
    await enqueue(client, concurrency_key="cust:7")
    assert len(await claim(client, max_jobs=3)) == 3
    r = await client.get("/v1/limits")
    assert r.status_code == 200, r.text
    running = {limit["pattern"]: limit["running"] for limit in r.json()["limits"]}
    assert running == {"cust:*": 1, "cust:4*": 2}
