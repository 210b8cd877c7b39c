"""What a workflow step and a batch callback take (issue 40, items 5 and 8b).

A step that runs ``after`` others takes ``on_parent_failure`` (docs/guides/composing.md's "nightly-etl" runs
its notify step whatever the load step did); a step without ``after`` giving it, and a batch
callback with an ``ordering_key``, are refused naming the field, with nothing written.
"""

from __future__ import annotations

from typing import Any

import httpx
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from jobq_client import Step
from tests.api.client_helpers import running_service
from tests.api.helpers import claim, get_job, lease, lease_call

# The example of docs/guides/composing.md.
NIGHTLY_ETL: dict[str, Any] = {
    "name": "nightly-etl",
    "steps": [
        {"name": "extract", "queue": "etl", "type": "extract"},
        {"name": "transform", "queue": "etl", "type": "transform", "after": ["extract"]},
        {"name": "load", "queue": "etl", "type": "load", "after": ["transform"]},
        {
            "name": "notify",
            "queue": "mail",
            "type": "notify",
            "after": ["load"],
            "on_parent_failure": "run",
        },
    ],
}


def _fields(response: httpx.Response) -> list[str]:
    assert response.status_code == 422, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    return [e["field"] for e in response.json()["errors"]]


async def _count(engine: AsyncEngine, table: str) -> int:
    async with engine.connect() as conn:
        return int(await conn.scalar(text(f"SELECT count(*) FROM {table}")) or 0)


async def _settle(client: httpx.AsyncClient, queue: str, *, ok: bool) -> dict[str, Any]:
    [job] = await claim(client, queues=[queue])
    if ok:
        await lease_call(client, "complete", "w1", lease(job, result={"step": job["type"]}))
    else:
        await lease_call(client, "fail", "w1", lease(job, error="no", retryable=False))
    return job


async def test_the_readme_workflow_runs_its_notify_step_after_a_failed_load(
    client: httpx.AsyncClient,
) -> None:
    r = await client.post("/v1/workflows", json=NIGHTLY_ETL)
    assert r.status_code == 201, r.text
    notify = next(s for s in r.json()["steps"] if s["name"] == "notify")["job"]
    assert notify["on_parent_failure"] == "run" and notify["status"] == "waiting"
    await _settle(client, "etl", ok=True)
    await _settle(client, "etl", ok=True)
    load = await _settle(client, "etl", ok=False)
    assert (await get_job(client, load["id"]))["status"] == "dead"
    [ran] = await claim(client, queues=["mail"])
    assert ran["id"] == notify["id"]
    assert ran["parents"]["dead"] == 1 and ran["parents"]["failed_ids"] == [load["id"]]


async def test_a_step_without_after_giving_on_parent_failure_is_refused_naming_it(
    client: httpx.AsyncClient, clean_db: AsyncEngine
) -> None:
    body = {
        "name": "w",
        "steps": [
            {"name": "a", "type": "t"},
            {"name": "b", "type": "t", "on_parent_failure": "run"},
        ],
    }
    assert _fields(await client.post("/v1/workflows", json=body)) == [
        "body.steps[1].on_parent_failure"
    ]
    assert await _count(clean_db, "workflows") == 0 and await _count(clean_db, "jobs") == 0


async def test_a_step_still_refuses_the_fields_only_a_job_takes(
    client: httpx.AsyncClient, clean_db: AsyncEngine
) -> None:
    for name, value in (("idempotency_key", "k"), ("depends_on", [1]), ("ordering_key", "k")):
        body = {"name": "w", "steps": [{"name": "a", "type": "t", name: value}]}
        assert _fields(await client.post("/v1/workflows", json=body)) == [
            f"body.steps[0].{name}"
        ], name
    assert await _count(clean_db, "workflows") == 0


async def test_the_python_client_makes_a_run_anyway_step(
    database_url: str, clean_db: AsyncEngine
) -> None:
    async with running_service(database_url) as service, service.client() as client:
        created = await client.workflow(
            "nightly-etl",
            [
                Step("load", "load", queue="etl"),
                Step("notify", "notify", queue="mail", after=["load"], on_parent_failure="run"),
            ],
        )
        steps = {s["name"]: s["job"] for s in created["steps"]}
        assert steps["notify"]["on_parent_failure"] == "run"
        [held] = await client.claim("w1", ["etl"])
        await client.fail("w1", [{**lease(held), "error": "no", "retryable": False}])
        [ran] = await client.claim("w1", ["mail"])
        assert ran["id"] == steps["notify"]["id"] and ran["parents"]["dead"] == 1


async def test_a_batch_callback_with_an_ordering_key_is_refused_naming_it(
    client: httpx.AsyncClient, clean_db: AsyncEngine
) -> None:
    body = {
        "jobs": [{"queue": "b", "type": "t"}],
        "callback": {"queue": "b", "type": "done", "ordering_key": "acct-1"},
    }
    assert _fields(await client.post("/v1/jobs/batch", json=body)) == ["body.callback.ordering_key"]
    assert await _count(clean_db, "jobs") == 0
    # The batch's own jobs may still carry ordering keys.
    body = {
        "jobs": [{"queue": "b", "type": "t", "ordering_key": "acct-1"}],
        "callback": {"queue": "b", "type": "done"},
    }
    assert (await client.post("/v1/jobs/batch", json=body)).status_code == 201
