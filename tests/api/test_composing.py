"""Composing work over HTTP: depends_on, batch callbacks, ordering keys and workflows (issue 21).

The app runs in process with its lifespan; what decides (the triggers of migration 0021) runs in
the real database. Each refusal is a 422 problem naming the field.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.api.helpers import claim, enqueue, get_job, lease, lease_call, running_app
from tests.api.test_longpoll import parked
from tests.polling import poll_until


async def _run(client: httpx.AsyncClient, queue: str, *, ok: bool = True, **extra: Any) -> Any:
    [job] = await claim(client, queues=[queue], max_jobs=1)
    if ok:
        await lease_call(client, "complete", "w1", lease(job, **extra))
    else:
        await lease_call(client, "fail", "w1", lease(job, error="no", retryable=False))
    return job


def _field(response: httpx.Response) -> str:
    assert response.status_code == 422, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    field: str = response.json()["errors"][0]["field"]
    return field


async def test_bad_links_are_refused_naming_the_field(client: httpx.AsyncClient) -> None:
    job = await enqueue(client)
    cases = [
        ({"type": "t", "depends_on": [999999]}, "body.depends_on[0]"),
        ({"type": "t", "depends_on": [job["id"], 999999]}, "body.depends_on[1]"),
        ({"type": "t", "depends_on": []}, "body.depends_on"),
        ({"type": "t", "depends_on": [0]}, "body.depends_on[0]"),
        ({"type": "t", "depends_on": ["1"]}, "body.depends_on[0]"),
        ({"type": "t", "depends_on": [job["id"]], "ordering_key": "k"}, "body"),
        ({"type": "t", "on_parent_failure": "run"}, "body"),
        (
            {"type": "t", "depends_on": [job["id"]], "on_parent_failure": "maybe"},
            "body.on_parent_failure",
        ),
        ({"type": "t", "ordering_key": ""}, "body.ordering_key"),
    ]
    for body, field in cases:
        assert _field(await client.post("/v1/jobs", json=body)) == field, body
    batch = {"jobs": [{"type": "t"}, {"type": "t", "depends_on": [999999]}]}
    assert _field(await client.post("/v1/jobs/batch", json=batch)) == "body.jobs[1].depends_on[0]"
    r = await client.get("/v1/jobs?queue=default")
    assert len(r.json()["jobs"]) == 1  # nothing of the refused calls was written


async def test_a_child_gets_its_parents_results_and_large_ones_by_reference(
    database_url: str, clean_db: AsyncEngine
) -> None:
    async with running_app(database_url, parent_result_inline_max_bytes=64) as client:
        small = await enqueue(client, queue="p")
        large = await enqueue(client, queue="p")
        child = await enqueue(client, queue="c", depends_on=[small["id"], large["id"]])
        assert child["status"] == "waiting" and child["depends_on"] == [small["id"], large["id"]]
        assert await claim(client, queues=["c"]) == []  # waiting: not claimable
        await _run(client, "p", result={"n": 1})
        await _run(client, "p", result={"blob": "x" * 200})
        [claimed] = await claim(client, queues=["c"])
        parents = claimed["parents"]
        assert (parents["total"], parents["succeeded"], parents["failed_ids"]) == (2, 2, [])
        first, second = parents["jobs"]
        assert first["result"] == {"n": 1} and not first["result_by_reference"]
        assert second["result"] is None and second["result_by_reference"]
        assert (await get_job(client, second["id"]))["result"] == {"blob": "x" * 200}
        events = (await client.get(f"/v1/jobs/{child['id']}/events")).json()["events"]
        assert [e["kind"] for e in events][:2] == ["enqueued", "ready"]


async def test_a_batch_callback_comes_once_with_counts_and_the_failed_ids(
    client: httpx.AsyncClient,
) -> None:
    body = {
        "jobs": [{"queue": "b", "type": "t"} for _ in range(3)],
        "callback": {"queue": "cb", "type": "report", "when": "all_finished", "payload": {"x": 1}},
    }
    r = await client.post("/v1/jobs/batch", json=body)
    assert r.status_code == 201, r.text
    jobs, callback = r.json()["jobs"], r.json()["callback"]
    assert callback["status"] == "waiting" and callback["on_parent_failure"] == "run"
    assert callback["depends_on"] == [j["id"] for j in jobs]
    await _run(client, "b")
    failed = await _run(client, "b", ok=False)
    assert await claim(client, queues=["cb"]) == []
    await _run(client, "b")
    [report] = await claim(client, queues=["cb"], max_jobs=5)
    assert report["id"] == callback["id"] and report["payload"] == {"x": 1}
    parents = report["parents"]
    assert (parents["succeeded"], parents["dead"], parents["failed_ids"]) == (2, 1, [failed["id"]])
    assert await claim(client, queues=["cb"]) == []  # exactly once

    body["callback"]["when"] = "all_succeeded"
    r = await client.post("/v1/jobs/batch", json=body)
    callback = r.json()["callback"]
    await _run(client, "b", ok=False)
    assert (await get_job(client, callback["id"]))["status"] == "cancelled"


async def test_ordered_jobs_are_claimed_one_at_a_time_in_enqueue_order(
    client: httpx.AsyncClient,
) -> None:
    ids = [(await enqueue(client, queue="o", ordering_key="acct-1"))["id"] for _ in range(3)]
    free = await enqueue(client, queue="o")
    seen = []
    for _ in range(3):
        jobs = await claim(client, queues=["o"], max_jobs=10)
        seen.extend(j["id"] for j in jobs if j["ordering_key"])
        assert len([j for j in jobs if j["ordering_key"]]) == 1
        for job in jobs:
            await lease_call(client, "complete", "w1", lease(job))
    assert seen == ids and (await get_job(client, free["id"]))["status"] == "succeeded"


async def test_a_workflow_is_created_read_cancelled_and_retried_whole(
    client: httpx.AsyncClient,
) -> None:
    flow = {
        "name": "nightly",
        "steps": [
            {"name": "load", "type": "load", "queue": "etl", "after": ["clean", "fetch"]},
            {"name": "fetch", "type": "fetch", "queue": "etl", "max_attempts": 1},
            {"name": "clean", "type": "clean", "queue": "etl", "after": ["fetch"]},
        ],
    }
    r = await client.post("/v1/workflows", json=flow)
    assert r.status_code == 201, r.text
    workflow = r.json()
    steps = {s["name"]: s for s in workflow["steps"]}
    assert workflow["state"] == "running" and workflow["counts"] == {"pending": 1, "waiting": 2}
    assert steps["load"]["after"] == ["fetch", "clean"]
    assert steps["load"]["job"]["workflow_step"] == "load"

    await _run(client, "etl", ok=False)  # fetch ends dead: the rest is cancelled
    r = await client.get(f"/v1/workflows/{workflow['id']}")
    assert r.json()["state"] == "failed"
    assert r.json()["counts"] == {"dead": 1, "cancelled": 2}

    r = await client.post(f"/v1/workflows/{workflow['id']}/retry")
    assert r.json() == {
        "workflow_id": workflow["id"],
        "changed": 3,
        "steps": {"fetch": "pending", "clean": "waiting", "load": "waiting"},
    }
    fetched = await _run(client, "etl", result={"rows": 3})
    [clean] = await claim(client, queues=["etl"])
    assert clean["workflow_step"] == "clean"
    assert clean["parents"]["jobs"][0] == {
        "id": fetched["id"],
        "step": "fetch",
        "status": "succeeded",
        "result": {"rows": 3},
        "result_by_reference": False,
        "result_hidden": False,
    }
    r = await client.post(f"/v1/workflows/{workflow['id']}/cancel")
    assert r.json()["steps"] == {"clean": "cancelled", "load": "cancelled"}
    assert (await get_job(client, clean["id"]))["status"] == "cancelled"
    r = await client.get("/v1/audit")
    assert {"workflow.retry", "workflow.cancel"} <= {e["action"] for e in r.json()["entries"]}


async def test_a_workflow_that_cannot_run_is_refused_naming_the_step(
    client: httpx.AsyncClient,
) -> None:
    def steps(*pairs: tuple[str, list[str]]) -> dict[str, Any]:
        return {"name": "w", "steps": [{"name": n, "type": "t", "after": a} for n, a in pairs]}

    cases = [
        (steps(("a", []), ("a", [])), "body.steps[1].name"),
        (steps(("a", ["ghost"])), "body.steps[0].after"),
        (steps(("a", ["b"]), ("b", ["c"]), ("c", ["a"])), "body.steps[0].after"),
        ({"name": "w", "steps": []}, "body.steps"),
        (
            {"name": "w", "steps": [{"name": "a", "type": "t", "idempotency_key": "k"}]},
            "body.steps[0].idempotency_key",  # a job's field, not a step's
        ),
    ]
    for body, field in cases:
        assert _field(await client.post("/v1/workflows", json=body)) == field, body
    assert (await client.get("/v1/workflows/1")).status_code == 404
    assert (await client.get("/v1/workflows/0")).status_code == 404
    assert (await client.get("/v1/jobs?queue=default")).json()["jobs"] == []


async def test_a_scoped_key_cannot_name_or_learn_of_a_parent_outside_its_queues(
    client: httpx.AsyncClient, anonymous: httpx.AsyncClient, keys: Any
) -> None:
    admin = {"Authorization": f"Bearer {keys.admin}"}
    scoped = {"Authorization": f"Bearer {keys.scoped_producer}"}
    r = await anonymous.post("/v1/jobs", json={"queue": "emails", "type": "t"}, headers=admin)
    hidden = r.json()["id"]
    body = {"queue": "billing.eu", "type": "t", "depends_on": [hidden]}
    r = await anonymous.post("/v1/jobs", json=body, headers=scoped)
    assert _field(r) == "body.depends_on[0]"
    assert r.json()["detail"] == f"depends_on names job {hidden}, which does not exist"


async def test_a_claim_waiting_on_the_childs_queue_wakes_when_the_last_parent_succeeds(
    database_url: str, clean_db: AsyncEngine
) -> None:
    """The trigger announces the child on jobq_wakeup: the long poll needs no backstop tick
    (running_app's backstop is far longer than this wait)."""
    async with running_app(database_url) as client:
        parent = await enqueue(client, queue="p")
        child = await enqueue(client, queue="c", depends_on=[parent["id"]])
        waiting = asyncio.create_task(claim(client, queues=["c"], wait_seconds=10))
        await poll_until(parked(client), within=5)
        started = time.monotonic()
        await _run(client, "p")
        [claimed] = await asyncio.wait_for(waiting, 10)
        assert claimed["id"] == child["id"]
        assert time.monotonic() - started < 5


async def test_a_waiting_job_says_what_it_waits_for(client: httpx.AsyncClient) -> None:
    first = await enqueue(client, queue="w")
    second = await enqueue(client, queue="w")
    child = await enqueue(client, queue="w", depends_on=[first["id"], second["id"]])
    head = await enqueue(client, queue="w", ordering_key="k")
    behind = await enqueue(client, queue="w", ordering_key="k")

    r = await client.get(f"/v1/jobs/{child['id']}/blockers")
    assert r.json()["blockers"] == [
        {
            "kind": "parents",
            "message": f"waits for 2 unfinished job(s): {first['id']}, {second['id']}",
            "until": None,
        }
    ]
    r = await client.get(f"/v1/jobs/{behind['id']}/blockers")
    assert r.json()["blockers"] == [
        {
            "kind": "ordering_key",
            "message": f"job {head['id']} of ordering key k runs first",
            "until": None,
        }
    ]
