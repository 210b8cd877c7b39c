"""Concurrency keys and rate limits through the API: set, enforced by the claim, given back."""

from __future__ import annotations

from typing import Any

import httpx
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.api.helpers import claim, enqueue, lease, lease_call


async def set_limit(client: httpx.AsyncClient, **body: Any) -> dict[str, Any]:
    r = await client.put("/v1/limits", json=body)
    assert r.status_code in (200, 201), r.text
    limit: dict[str, Any] = r.json()
    return limit


async def test_a_key_never_runs_more_than_max_running_and_others_go_on(
    client: httpx.AsyncClient,
) -> None:
    await set_limit(client, scope="key", pattern="customer:*", max_running=2)
    busy = [await enqueue(client, concurrency_key="customer:1") for _ in range(6)]
    other = [await enqueue(client, concurrency_key="customer:2") for _ in range(2)]
    free = await enqueue(client)  # no key: no limit
    got = await claim(client, max_jobs=10)
    ids = {j["id"] for j in got}
    # Two of the busy key (the oldest), both of the other key, the unkeyed job.
    assert ids == {busy[0]["id"], busy[1]["id"], other[0]["id"], other[1]["id"], free["id"]}
    assert all(j["concurrency_key"] in ("customer:1", "customer:2", None) for j in got)
    assert await claim(client, max_jobs=10) == []

    # A finished job frees its slot at once; fail and release do too.
    first = next(j for j in got if j["id"] == busy[0]["id"])
    [done] = await lease_call(client, "complete", "w1", lease(first))
    assert done["ok"]
    [again] = await claim(client, max_jobs=10)
    assert again["id"] == busy[2]["id"]
    second = next(j for j in got if j["id"] == busy[1]["id"])
    [failed] = await lease_call(client, "fail", "w1", lease(second, error="x", retryable=False))
    assert failed["ok"] and failed["status"] == "dead"
    [third] = await claim(client, max_jobs=10)
    assert third["id"] == busy[3]["id"]
    [released] = await lease_call(client, "release", "w1", lease(third))
    assert released["ok"]
    # Released, its slot is free again (the job itself waits behind the older busy[4]).
    [back] = await claim(client, max_jobs=10)
    assert back["id"] == busy[4]["id"]


async def test_cancel_and_the_reaper_free_slots(
    client: httpx.AsyncClient, app: Any, clean_db: AsyncEngine
) -> None:
    from app.api.state import app_state

    await set_limit(client, scope="key", pattern="k", max_running=1)
    jobs = [await enqueue(client, concurrency_key="k", max_attempts=5) for _ in range(3)]
    [held] = await claim(client, max_jobs=3, lease_seconds=1)
    assert held["id"] == jobs[0]["id"]
    r = await client.post(f"/v1/jobs/{held['id']}/cancel")
    assert r.status_code == 200 and r.json()["status"] == "cancelled"
    [next_one] = await claim(client, max_jobs=3)
    assert next_one["id"] == jobs[1]["id"]
    # Expire its lease and reap: the slot comes back.
    async with clean_db.begin() as conn:
        await conn.execute(
            text("UPDATE jobs SET lease_expires_at = now() - interval '1 s' WHERE id = :id"),
            {"id": next_one["id"]},
        )
    service = app_state(app).running().services
    reaped = await service.upkeep.reap(batch_size=10)
    assert [r.id for r in reaped] == [next_one["id"]]
    [after] = await claim(client, max_jobs=3)
    assert after["id"] == jobs[2]["id"]
    async with clean_db.connect() as conn:
        running = await conn.scalar(
            text("SELECT running FROM flow_running WHERE key = 'key:default|k'")
        )
    assert running == 1


async def test_a_queue_limit_covers_every_job_of_the_queue(client: httpx.AsyncClient) -> None:
    await set_limit(client, scope="queue", pattern="reports", max_running=3)
    for n in range(5):
        await enqueue(client, queue="reports", concurrency_key=f"c{n}")
    got = await claim(client, queues=["reports"], max_jobs=10)
    assert len(got) == 3
    assert await claim(client, queues=["reports"], max_jobs=10) == []
    [done] = await lease_call(client, "complete", "w1", lease(got[0]))
    assert done["ok"]
    assert len(await claim(client, queues=["reports"], max_jobs=10)) == 1


async def test_key_and_queue_limits_both_hold(client: httpx.AsyncClient) -> None:
    await set_limit(client, scope="queue", pattern="q", max_running=3)
    await set_limit(client, scope="key", pattern="a", max_running=1)
    for key in ("a", "a", "b", "b", "b"):
        await enqueue(client, queue="q", concurrency_key=key)
    got = await claim(client, queues=["q"], max_jobs=10)
    assert sorted(j["concurrency_key"] for j in got) == ["a", "b", "b"]


async def test_the_most_specific_pattern_applies(client: httpx.AsyncClient) -> None:
    await set_limit(client, scope="key", pattern="customer:*", max_running=1)
    await set_limit(client, scope="key", pattern="customer:vip:*", max_running=3)
    for _ in range(4):
        await enqueue(client, concurrency_key="customer:vip:7")
        await enqueue(client, concurrency_key="customer:8")
    got = await claim(client, max_jobs=10)
    keys = sorted(j["concurrency_key"] for j in got)
    assert keys == ["customer:8", "customer:vip:7", "customer:vip:7", "customer:vip:7"]


async def test_a_rate_limit_spends_its_bucket_and_says_when_it_refills(
    client: httpx.AsyncClient, app: Any
) -> None:
    from app.api.state import app_state

    await set_limit(client, scope="queue", pattern="mail", rate={"limit": 3, "per_seconds": 60})
    for _ in range(5):
        await enqueue(client, queue="mail")
    assert len(await claim(client, queues=["mail"], max_jobs=10)) == 3
    assert await claim(client, queues=["mail"], max_jobs=10) == []
    service = app_state(app).running().services
    refill = service.jobs._refill_at.get(("mail",))
    assert refill is not None  # one token returns in about 20 s


async def test_raising_a_limit_applies_to_the_next_claim(client: httpx.AsyncClient) -> None:
    await set_limit(client, scope="key", pattern="k", max_running=1)
    for _ in range(3):
        await enqueue(client, concurrency_key="k")
    assert len(await claim(client, max_jobs=5)) == 1
    assert await claim(client, max_jobs=5) == []
    replaced = await client.put(
        "/v1/limits", json={"scope": "key", "pattern": "k", "max_running": 3}
    )
    assert replaced.status_code == 200, replaced.text
    assert len(await claim(client, max_jobs=5)) == 2
    [listed] = (await client.get("/v1/limits")).json()["limits"]
    assert listed["max_running"] == 3 and listed["running"] == 3


async def test_deleting_a_limit_lets_held_back_jobs_run(client: httpx.AsyncClient) -> None:
    limit = await set_limit(client, scope="key", pattern="k", max_running=1)
    for _ in range(3):
        await enqueue(client, concurrency_key="k")
    assert len(await claim(client, max_jobs=5)) == 1
    r = await client.delete(f"/v1/limits/{limit['id']}")
    assert r.status_code == 200
    assert len(await claim(client, max_jobs=5)) == 2
    assert (await client.delete(f"/v1/limits/{limit['id']}")).status_code == 404


async def test_bad_limits_are_422_naming_the_field(client: httpx.AsyncClient) -> None:
    cases = [
        ({"scope": "key", "pattern": "k"}, "body"),
        ({"scope": "nope", "pattern": "k", "max_running": 1}, "body.scope"),
        ({"scope": "key", "pattern": "", "max_running": 1}, "body.pattern"),
        ({"scope": "key", "pattern": "k", "max_running": 0}, "body.max_running"),
        (
            {"scope": "key", "pattern": "k", "rate": {"limit": 0, "per_seconds": 1}},
            "body.rate.limit",
        ),
        (
            {"scope": "key", "pattern": "k", "rate": {"limit": 1, "per_seconds": 0}},
            "body.rate.per_seconds",
        ),
        ({"scope": "key", "pattern": "a b", "max_running": 1}, "body"),
    ]
    for body, field in cases:
        r = await client.put("/v1/limits", json=body)
        assert r.status_code == 422, (body, r.text)
        fields = [e["field"] for e in r.json()["errors"]]
        assert any(f.startswith(field) for f in fields), (body, fields)
    long_key = {"queue": "default", "type": "t", "concurrency_key": "k" * 256}
    r = await client.post("/v1/jobs", json=long_key)
    assert r.status_code == 422 and r.json()["errors"][0]["field"] == "body.concurrency_key"


async def test_limit_changes_are_audited(client: httpx.AsyncClient) -> None:
    limit = await set_limit(client, scope="key", pattern="k", max_running=1)
    await client.delete(f"/v1/limits/{limit['id']}")
    entries = (await client.get("/v1/audit")).json()["entries"]
    assert [e["action"] for e in entries] == ["limit.delete", "limit.set"]


async def test_a_parked_claim_is_answered_when_its_keys_bucket_refills(
    client: httpx.AsyncClient,
) -> None:
    import time

    await set_limit(client, scope="key", pattern="r", rate={"limit": 1, "per_seconds": 0.3})
    for _ in range(2):
        await enqueue(client, concurrency_key="r")
    assert len(await claim(client, max_jobs=5)) == 1
    started = time.monotonic()
    [second] = await claim(client, max_jobs=5, wait_seconds=5)
    waited = time.monotonic() - started
    # The token returns 0.3 s after the first claim; the once-a-second backstop is not needed.
    assert second["concurrency_key"] == "r"
    assert 0.1 <= waited < 0.8, waited
