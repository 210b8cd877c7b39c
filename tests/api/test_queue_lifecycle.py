"""Queues are created with PUT and deleted with DELETE; pause and resume act only on queues that
exist, so a mistyped name answers 404 and leaves nothing behind."""

from __future__ import annotations

import httpx

from tests.api.helpers import claim, enqueue, lease, lease_call


async def _overview(client: httpx.AsyncClient) -> dict[str, dict[str, object]]:
    r = await client.get("/v1/queues")
    assert r.status_code == 200, r.text
    return {q["name"]: q for q in r.json()["queues"]}


async def _audit(client: httpx.AsyncClient) -> list[tuple[str, str, str | None, str | None]]:
    """The audit trail's queue entries, oldest first: action, outcome, state before and after."""
    entries = (await client.get("/v1/audit")).json()["entries"]
    return [
        (e["action"], e["outcome"], e["state_before"], e["state_after"])
        for e in reversed(entries)
        if e["action"].startswith("queue.")
    ]


async def test_pausing_a_mistyped_queue_is_404_and_leaves_no_queue(
    client: httpx.AsyncClient,
) -> None:
    """A typo in a pause or resume answers a problem naming the queue, and the overview and the
    audit trail stay as they were."""
    await enqueue(client, queue="emails")
    for action in ("pause", "resume"):
        r = await client.post(f"/v1/queues/emials/{action}")
        assert r.status_code == 404, r.text
        assert r.headers["content-type"] == "application/problem+json"
        assert "emials" in r.json()["detail"]
    assert set(await _overview(client)) == {"emails"}
    assert await _audit(client) == []


async def test_a_created_queue_can_be_paused_before_its_first_job(
    client: httpx.AsyncClient,
) -> None:
    """PUT creates the queue (201, then 200); paused before any job, it holds the jobs enqueued
    to it until it is resumed."""
    r = await client.put("/v1/queues/reports")
    assert r.status_code == 201 and r.json() == {
        "name": "reports",
        "paused": False,
        "callback_url": None,
    }
    assert (await client.put("/v1/queues/reports")).status_code == 200
    assert (await _overview(client))["reports"]["pending"] == 0

    r = await client.post("/v1/queues/reports/pause")
    assert r.status_code == 200 and r.json()["paused"] is True
    job = await enqueue(client, queue="reports")
    assert await claim(client, queues=["reports"]) == []
    assert (await _overview(client))["reports"]["paused"] is True

    assert (await client.post("/v1/queues/reports/resume")).status_code == 200
    assert [j["id"] for j in await claim(client, queues=["reports"])] == [job["id"]]
    assert await _audit(client) == [
        ("queue.create", "changed", None, "active"),
        ("queue.create", "unchanged", "active", "active"),
        ("queue.pause", "changed", "active", "paused"),
        ("queue.resume", "changed", "paused", "active"),
    ]


async def test_put_can_create_a_queue_paused_and_switch_it(client: httpx.AsyncClient) -> None:
    """The body's ``paused`` sets the switch; leaving it out keeps it."""
    r = await client.put("/v1/queues/night", json={"paused": True})
    assert r.status_code == 201 and r.json()["paused"] is True
    r = await client.put("/v1/queues/night", json={})
    assert r.status_code == 200 and r.json()["paused"] is True
    r = await client.put("/v1/queues/night", json={"paused": False})
    assert r.status_code == 200 and r.json()["paused"] is False
    assert [a[:2] for a in await _audit(client)] == [
        ("queue.create", "changed"),
        ("queue.create", "unchanged"),
        ("queue.resume", "changed"),
    ]


async def test_put_of_a_queue_known_by_its_jobs_is_200(client: httpx.AsyncClient) -> None:
    """Enqueueing still creates a queue; PUT then finds it there."""
    await enqueue(client, queue="implicit")
    r = await client.put("/v1/queues/implicit", json={"paused": True})
    assert r.status_code == 200 and r.json()["paused"] is True
    assert await claim(client, queues=["implicit"]) == []


async def test_put_refuses_unknown_fields(client: httpx.AsyncClient) -> None:
    r = await client.put("/v1/queues/q", json={"pasued": True})
    assert r.status_code == 422 and r.json()["errors"][0]["field"] == "body.pasued"
    assert await _overview(client) == {}


async def test_deleting_an_empty_queue_removes_it_from_the_overview(
    client: httpx.AsyncClient,
) -> None:
    """An empty queue, paused or not, is deleted (204) and gone; deleting it again is 404."""
    assert (await client.put("/v1/queues/typo", json={"paused": True})).status_code == 201
    assert "typo" in await _overview(client)
    r = await client.delete("/v1/queues/typo")
    assert r.status_code == 204 and r.content == b""
    assert "typo" not in await _overview(client)
    r = await client.delete("/v1/queues/typo")
    assert r.status_code == 404 and r.headers["content-type"] == "application/problem+json"
    assert (await client.post("/v1/queues/typo/pause")).status_code == 404
    assert (await _audit(client))[-1] == ("queue.delete", "changed", "paused", None)


async def test_a_queue_holding_jobs_cannot_be_deleted(client: httpx.AsyncClient) -> None:
    """409 while any job names the queue, unfinished or finished; the queue and its switch stay."""
    assert (await client.put("/v1/queues/busy", json={"paused": True})).status_code == 201
    await enqueue(client, queue="busy")
    r = await client.delete("/v1/queues/busy")
    assert r.status_code == 409, r.text
    assert r.headers["content-type"] == "application/problem+json"
    assert "1 unfinished and 0 finished" in r.json()["detail"]
    assert (await _overview(client))["busy"]["paused"] is True

    await client.post("/v1/queues/busy/resume")
    [job] = await claim(client, queues=["busy"])
    await lease_call(client, "complete", "w1", lease(job))
    r = await client.delete("/v1/queues/busy")
    assert r.status_code == 409 and "0 unfinished and 1 finished" in r.json()["detail"]

    r = await client.post("/v1/jobs/bulk/delete", json={"queue": "busy"})
    assert r.status_code == 200, r.text
    assert (await client.delete("/v1/queues/busy")).status_code == 204
    assert "busy" not in await _overview(client)


async def test_a_queue_known_only_by_its_jobs_is_409_not_404(client: httpx.AsyncClient) -> None:
    await enqueue(client, queue="implicit")
    assert (await client.delete("/v1/queues/implicit")).status_code == 409
    assert (await client.delete("/v1/queues/never")).status_code == 404
