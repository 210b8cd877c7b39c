"""Composing work, the edges found from outside (issue 40): a job cancelled as it is inserted
gets its webhook; an operator's retry of a job whose parent is still open makes it wait, not run;
the next job of an ordering key is made due only once its own parents have ended."""

from __future__ import annotations

import httpx
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.api.helpers import claim, enqueue, get_job, lease, lease_call, running_app
from tests.api.test_webhooks import HOOKS, _loop
from tests.webhook_receiver import receiver


async def test_a_job_cancelled_at_insert_because_its_parent_failed_gets_its_webhook(
    database_url: str, clean_db: AsyncEngine
) -> None:
    async with receiver() as hook, running_app(database_url, **HOOKS) as client:
        parent = await enqueue(client, queue="q")
        [held] = await claim(client, queues=["q"])
        await lease_call(client, "fail", "w1", lease(held, error="no", retryable=False))
        child = await enqueue(
            client, queue="q", depends_on=[parent["id"]], callback_url=hook.url("/child")
        )
        assert child["status"] == "cancelled"
        assert (await _loop(client).run_once()).delivered == 1
        [got] = hook.received
        assert got.json["job_id"] == child["id"] and got.json["status"] == "cancelled"
        listed = (await client.get(f"/v1/jobs/{child['id']}/webhooks")).json()["deliveries"]
        assert [d["state"] for d in listed] == ["delivered"]


async def test_retrying_a_job_whose_parent_is_open_makes_it_wait_for_the_parent(
    client: httpx.AsyncClient,
) -> None:
    parent = await enqueue(client, queue="p")
    child = await enqueue(client, queue="c", depends_on=[parent["id"]])
    r = await client.post(f"/v1/jobs/{child['id']}/cancel")
    assert r.json()["status"] == "cancelled"
    r = await client.post(f"/v1/jobs/{child['id']}/retry")
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "waiting"
    assert await claim(client, queues=["c"]) == []
    [held] = await claim(client, queues=["p"])
    await lease_call(client, "complete", "w1", lease(held))
    assert (await get_job(client, child["id"]))["status"] == "pending"


async def test_a_bulk_retry_makes_jobs_with_open_parents_wait(client: httpx.AsyncClient) -> None:
    parent = await enqueue(client, queue="p")
    child = await enqueue(client, queue="c", depends_on=[parent["id"]])
    alone = await enqueue(client, queue="c")
    for job in (child, alone):
        await client.post(f"/v1/jobs/{job['id']}/cancel")
    r = await client.post("/v1/jobs/bulk/retry", json={"queue": "c", "status": "cancelled"})
    assert r.status_code == 200, r.text
    assert r.json()["changed"] == 2
    assert (await get_job(client, child["id"]))["status"] == "waiting"
    assert (await get_job(client, alone["id"]))["status"] == "pending"


async def test_retrying_a_job_whose_parents_ended_makes_it_due_at_once(
    client: httpx.AsyncClient,
) -> None:
    parent = await enqueue(client, queue="p")
    child = await enqueue(client, queue="c", depends_on=[parent["id"]])
    [held] = await claim(client, queues=["p"])
    await lease_call(client, "fail", "w1", lease(held, error="no", retryable=False))
    assert (await get_job(client, child["id"]))["status"] == "cancelled"
    # The operator's call: run it although its parent failed.
    r = await client.post(f"/v1/jobs/{child['id']}/retry")
    assert r.json()["status"] == "pending"


async def test_an_ordering_keys_next_job_waits_for_its_own_parents(
    client: httpx.AsyncClient, clean_db: AsyncEngine
) -> None:
    # Rows the API no longer makes (a job with both parents and an ordering key), as an older
    # version or a hand may have left them: the key's turn does not skip the parents.
    first = await enqueue(client, queue="k", ordering_key="acct")
    parent = await enqueue(client, queue="p")
    async with clean_db.begin() as conn:
        second = (
            await conn.execute(
                text(
                    "INSERT INTO jobs (queue, type, max_attempts, lease_seconds, ordering_key, "
                    "depends_on) VALUES ('k', 't', 5, 30, 'acct', ARRAY[:parent]::bigint[]) "
                    "RETURNING id, status"
                ),
                {"parent": parent["id"]},
            )
        ).one()
    assert second.status == "waiting"
    [held] = await claim(client, queues=["k"])
    assert held["id"] == first["id"]
    await lease_call(client, "complete", "w1", lease(held))
    assert (await get_job(client, second.id))["status"] == "waiting"
    [held] = await claim(client, queues=["p"])
    await lease_call(client, "complete", "w1", lease(held))
    assert (await get_job(client, second.id))["status"] == "pending"
