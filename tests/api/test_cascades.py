"""Graphs at the largest size the API takes: a 1,000-step chain, a 1 -> 999 fan-out, 1,000 parents.

Before migration 0025 the finish trigger cancelled each waiting dependent with an UPDATE of its
own, which fired the same trigger one level deeper: a chain of about 700 steps overflowed
PostgreSQL's stack. The fail that ended the head answered 500 and left it running; a lease expiry
made every reaper batch fail, for every queue. Each way a head can end is driven here at the
maximum size, and the nesting is measured: two trigger levels, whatever the depth of the graph.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.api.state import app_state
from app.maintenance.reaper import Reaper, ReaperConfig
from tests.api.helpers import claim, enqueue, get_job, lease, lease_call

STEPS = 1000  # JOBQ_WORKFLOW_MAX_STEPS and JOBQ_DEPENDS_ON_MAX, by default


async def _chain(
    client: httpx.AsyncClient, *, head_queue: str = "chain", run_anyway_at: int | None = None
) -> list[int]:
    """A workflow s0 -> s1 -> ... -> s999 (s0 alone in ``head_queue``, one attempt); its ids."""
    steps: list[dict[str, Any]] = [
        {"name": "s0", "queue": head_queue, "type": "t", "max_attempts": 1}
    ]
    for i in range(1, STEPS):
        step: dict[str, Any] = {
            "name": f"s{i}",
            "queue": "chain",
            "type": "t",
            "after": [f"s{i - 1}"],
        }
        if i == run_anyway_at:
            step["on_parent_failure"] = "run"
        steps.append(step)
    r = await client.post("/v1/workflows", json={"name": "long", "steps": steps})
    assert r.status_code == 201, r.text
    by_name = {s["name"]: s["job"]["id"] for s in r.json()["steps"]}
    return [by_name[f"s{i}"] for i in range(STEPS)]


async def _states(engine: AsyncEngine, ids: list[int]) -> Counter[str]:
    async with engine.connect() as conn:
        rows = await conn.execute(
            text("SELECT status FROM jobs WHERE id = ANY(:ids)"), {"ids": ids}
        )
        return Counter(r.status for r in rows)


@pytest.fixture
async def trigger_depth(clean_db: AsyncEngine) -> AsyncIterator[AsyncEngine]:
    """Records the trigger nesting level of every status change of a job while the test runs."""
    async with clean_db.begin() as conn:
        await conn.execute(text("CREATE TABLE IF NOT EXISTS test_depth (depth int)"))
        await conn.execute(text("TRUNCATE test_depth"))
        # Named with its schema: jobq's triggers run with pg_catalog as their only path.
        schema = (await conn.execute(text("SELECT current_schema()"))).scalar_one()
        await conn.execute(
            text(
                "CREATE OR REPLACE FUNCTION test_depth() RETURNS trigger LANGUAGE plpgsql AS $$ "
                f'BEGIN INSERT INTO "{schema}".test_depth VALUES (pg_trigger_depth()); '
                "RETURN NULL; END $$"
            )
        )
        await conn.execute(
            text(
                "CREATE TRIGGER test_depth AFTER UPDATE OF status ON jobs FOR EACH ROW "
                "EXECUTE FUNCTION test_depth()"
            )
        )
    try:
        yield clean_db
    finally:
        async with clean_db.begin() as conn:
            await conn.execute(text("DROP TRIGGER test_depth ON jobs"))


async def _deepest(engine: AsyncEngine) -> int:
    async with engine.connect() as conn:
        return int((await conn.execute(text("SELECT max(depth) FROM test_depth"))).scalar_one())


async def _claim_head(client: httpx.AsyncClient, queue: str = "chain") -> dict[str, Any]:
    [head] = await claim(client, queues=[queue], max_jobs=5)
    return head


async def _assert_chain_cancelled(
    client: httpx.AsyncClient, engine: AsyncEngine, ids: list[int], head_state: str
) -> None:
    assert await _states(engine, ids) == Counter([head_state] + ["cancelled"] * (STEPS - 1))
    # Each step records the parent it was cancelled for: the one before it.
    for i in (1, 500, STEPS - 1):
        r = await client.get(f"/v1/jobs/{ids[i]}/events")
        [event] = [e for e in r.json()["events"] if e["kind"] == "cancelled"]
        assert event["data"]["parent_id"] == ids[i - 1], event
        assert event["data"]["parent_status"] == (head_state if i == 1 else "cancelled")


async def test_a_chain_whose_head_fails_is_cancelled_in_one_request(
    client: httpx.AsyncClient, trigger_depth: AsyncEngine
) -> None:
    ids = await _chain(client)
    head = await _claim_head(client)
    [result] = await lease_call(client, "fail", "w1", lease(head, error="boom", retryable=False))
    assert result["ok"] and result["status"] == "dead"
    await _assert_chain_cancelled(client, trigger_depth, ids, "dead")
    assert await _deepest(trigger_depth) <= 2


async def test_a_chain_whose_head_lease_expires_is_reaped_with_every_other_queue(
    app: FastAPI, client: httpx.AsyncClient, trigger_depth: AsyncEngine
) -> None:
    ids = await _chain(client)
    await _claim_head(client)
    unrelated = await enqueue(client, queue="other", max_attempts=3)
    await claim(client, queues=["other"], max_jobs=1)
    reaper = Reaper(services=app_state(app).running().services, config=ReaperConfig())
    counts = await reaper.run_once(now=datetime.now(UTC) + timedelta(hours=1))
    assert (counts.dead, counts.retried) == (1, 1)
    assert (await get_job(client, unrelated["id"]))["status"] == "scheduled"
    await _assert_chain_cancelled(client, trigger_depth, ids, "dead")
    assert await _deepest(trigger_depth) <= 2


async def test_a_chain_whose_head_is_cancelled(
    client: httpx.AsyncClient, trigger_depth: AsyncEngine
) -> None:
    ids = await _chain(client)
    r = await client.post(f"/v1/jobs/{ids[0]}/cancel")
    assert r.status_code == 200, r.text
    await _assert_chain_cancelled(client, trigger_depth, ids, "cancelled")
    assert await _deepest(trigger_depth) <= 2


async def test_a_chain_whose_head_is_bulk_cancelled(
    client: httpx.AsyncClient, trigger_depth: AsyncEngine
) -> None:
    ids = await _chain(client, head_queue="heads")
    r = await client.post("/v1/jobs/bulk/cancel", json={"queue": "heads"})
    assert r.status_code == 200, r.text
    assert r.json()["changed"] == 1
    await _assert_chain_cancelled(client, trigger_depth, ids, "cancelled")
    assert await _deepest(trigger_depth) <= 2


async def test_a_step_that_runs_anyway_stops_the_cascade_and_resumes_the_chain(
    client: httpx.AsyncClient, clean_db: AsyncEngine
) -> None:
    ids = await _chain(client, run_anyway_at=500)
    head = await _claim_head(client)
    await lease_call(client, "fail", "w1", lease(head, error="boom", retryable=False))
    assert await _states(clean_db, ids[1:500]) == Counter({"cancelled": 499})
    assert (await get_job(client, ids[500]))["status"] == "pending"
    assert await _states(clean_db, ids[501:]) == Counter({"waiting": STEPS - 501})
    [step] = await claim(client, queues=["chain"], max_jobs=5)
    assert step["id"] == ids[500]
    assert step["parents"]["failed_ids"] == [ids[499]]
    await lease_call(client, "complete", "w1", lease(step))
    assert (await get_job(client, ids[501]))["status"] == "pending"


async def _fan_out(client: httpx.AsyncClient) -> tuple[dict[str, Any], list[int], list[int]]:
    """A head and 999 children waiting for it, every third of them running anyway."""
    head = await enqueue(client, queue="fan-head")
    children = [
        {"queue": "fan", "type": "c", "depends_on": [head["id"]]}
        | ({"on_parent_failure": "run"} if i % 3 == 0 else {})
        for i in range(STEPS - 1)
    ]
    r = await client.post("/v1/jobs/batch", json={"jobs": children})
    assert r.status_code == 201, r.text
    jobs = r.json()["jobs"]
    anyway = [j["id"] for i, j in enumerate(jobs) if i % 3 == 0]
    others = [j["id"] for i, j in enumerate(jobs) if i % 3 != 0]
    return head, anyway, others


async def test_a_fan_out_of_999_becomes_due_with_its_parent_in_one_request(
    client: httpx.AsyncClient, clean_db: AsyncEngine
) -> None:
    _, anyway, others = await _fan_out(client)
    [held] = await claim(client, queues=["fan-head"], max_jobs=1)
    [result] = await lease_call(client, "complete", "w1", lease(held))
    assert result["ok"]
    assert await _states(clean_db, anyway + others) == Counter({"pending": STEPS - 1})
    claimed = await claim(client, queues=["fan"], max_jobs=100)
    assert len(claimed) == 100


async def test_a_fan_out_of_999_whose_parent_fails_cancels_or_runs_each_as_it_asks(
    client: httpx.AsyncClient, clean_db: AsyncEngine
) -> None:
    _, anyway, others = await _fan_out(client)
    [held] = await claim(client, queues=["fan-head"], max_jobs=1)
    await lease_call(client, "fail", "w1", lease(held, error="boom", retryable=False))
    assert await _states(clean_db, others) == Counter({"cancelled": len(others)})
    assert await _states(clean_db, anyway) == Counter({"pending": len(anyway)})


async def test_a_job_waiting_for_1000_parents_becomes_due_with_the_last(
    client: httpx.AsyncClient,
) -> None:
    r = await client.post(
        "/v1/jobs/batch", json={"jobs": [{"queue": "parents", "type": "p"}] * STEPS}
    )
    parents = [j["id"] for j in r.json()["jobs"]]
    child = await enqueue(client, queue="fan-in", depends_on=parents)
    assert child["status"] == "waiting"
    done = 0
    while done < STEPS:
        held = await claim(client, queues=["parents"], max_jobs=100)
        await lease_call(client, "complete", "w1", *(lease(j) for j in held))
        done += len(held)
        expected = "pending" if done == STEPS else "waiting"
        assert (await get_job(client, child["id"]))["status"] == expected, done
    [claimed] = await claim(client, queues=["fan-in"], max_jobs=1)
    assert claimed["parents"]["total"] == STEPS
    assert claimed["parents"]["succeeded"] == STEPS
