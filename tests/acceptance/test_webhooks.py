"""Completion webhooks end to end: two ``jobq serve`` instances, a real receiver on 127.0.0.1
(allowed explicitly), jobs completed, failed and cancelled, a receiver that answers 500 first,
and an instance killed with SIGKILL while it holds deliveries in flight: every finish reaches the
receiver with a valid signature, none is lost, and duplicates are only ever the same delivery id."""

from __future__ import annotations

import asyncio
import signal
from collections import Counter
from typing import Any

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from jobq_client import verify_signature
from tests.acceptance.helpers import claim, lease, lease_call
from tests.polling import poll_until
from tests.processes import JobqServers
from tests.webhook_receiver import Received, receiver

pytestmark = pytest.mark.acceptance

SECRET = "whsec_acceptance_secret_value"
QUEUE = "hooked"
JOBS = 30
ENV = {
    "JOBQ_WEBHOOK_SECRET": SECRET,
    "JOBQ_WEBHOOK_ALLOWED_NETWORKS": "127.0.0.1/32",
    "JOBQ_WEBHOOK_INTERVAL_SECONDS": "0.1",
    "JOBQ_WEBHOOK_TIMEOUT_SECONDS": "4",
    "JOBQ_WEBHOOK_IN_FLIGHT_SECONDS": "8",
    "JOBQ_WEBHOOK_BACKOFF_BASE_SECONDS": "0.2",
    "JOBQ_WEBHOOK_BACKOFF_CAP_SECONDS": "0.5",
    "JOBQ_WEBHOOK_BATCH_SIZE": "5",
}


async def _finish_all(client: httpx.AsyncClient, jobs: list[dict[str, Any]]) -> dict[int, str]:
    """Completes a third of the jobs, fails a third for good, cancels the rest; answers the
    status each should have."""
    expected: dict[int, str] = {}
    for index, job in enumerate(jobs):
        if index % 3 == 2:
            r = await client.post(f"/v1/jobs/{job['id']}/cancel")
            assert r.status_code == 200, r.text
            expected[job["id"]] = "cancelled"
    held = await claim(client, "w", QUEUE, max_jobs=JOBS)
    for index, job in enumerate(held):
        if index % 2 == 0:
            [res] = await lease_call(client, "complete", "w", [lease(job, result={"i": index})])
            expected[job["id"]] = "succeeded"
        else:
            item = lease(job, error="boom", retryable=False)
            [res] = await lease_call(client, "fail", "w", [item])
            expected[job["id"]] = "dead"
        assert res["ok"], res
    assert len(expected) == JOBS
    return expected


async def test_every_finish_is_delivered_signed_despite_500s_and_a_killed_instance(
    jobq_servers: JobqServers, clean_db: AsyncEngine
) -> None:
    victim_holds = asyncio.Event()
    hold = asyncio.Event()  # never set: a held request lasts until its sender dies

    async def answer(request: Received, seen_before: int) -> int:
        if seen_before == 0:
            return 500  # every delivery's first attempt fails
        if not victim_holds.is_set() and request.headers.get("x-held") is None:
            # The second attempt of the first delivery to get that far hangs: its sender is
            # killed while it waits, and another instance delivers it after the in-flight time.
            victim_holds.set()
            request.headers["x-held"] = "1"
            try:
                await asyncio.wait_for(hold.wait(), timeout=30)
            except TimeoutError:
                return 599
        return 200

    async with receiver(answer) as hook:
        # One instance first: it sends every delivery, and is killed while it holds one.
        victim = await jobq_servers.start(ENV)
        async with httpx.AsyncClient(base_url=victim.url, timeout=10) as client:
            body = {
                "jobs": [
                    {"queue": QUEUE, "type": "t", "payload": {"i": i}, "callback_url": hook.url()}
                    for i in range(JOBS)
                ]
            }
            r = await client.post("/v1/jobs/batch", json=body)
            assert r.status_code == 201, r.text
            expected = await _finish_all(client, r.json()["jobs"])
        await poll_until(victim_holds.is_set, within=30, what="a delivery held in flight")
        victim.send_signal(signal.SIGKILL)
        assert await victim.wait_exit(10) is not None
        held = next(r for r in hook.received if r.headers.get("x-held"))

        # Two instances take over: the held delivery comes due when its in-flight time is over.
        survivors = [await jobq_servers.start(ENV), await jobq_servers.start(ENV)]

        async def all_delivered() -> bool:
            got = {r.json["job_id"] for r in hook.accepted()}
            return got >= set(expected)

        await poll_until(all_delivered, within=90, what="every finish delivered", interval=0.2)
        hold.set()  # the held request's handler may end now (its sender is long gone)
        assert held.delivery_id in {r.delivery_id for r in hook.accepted()}
        async with httpx.AsyncClient(base_url=survivors[0].url, timeout=10) as client:
            job_id = held.json["job_id"]
            events = (await client.get(f"/v1/jobs/{job_id}/events")).json()["events"]
            outcomes = [e["data"]["outcome"] for e in events if e["kind"] == "webhook"]
            # The first attempt's 500, the killed attempt (nothing recorded), the delivery.
            assert outcomes == ["retrying", "delivered"], outcomes
            listed = (await client.get(f"/v1/jobs/{job_id}/webhooks")).json()["deliveries"]
            assert [(d["state"], d["attempts"]) for d in listed] == [("delivered", 3)]

    # Each finish is one delivery id; every request is signed; duplicates are the same id only.
    by_job: dict[int, set[str]] = {}
    for request in hook.received:
        verify_signature(request.body, request.headers["jobq-signature"], SECRET)
        payload = request.json
        assert payload["delivery_id"] == request.delivery_id
        assert payload["status"] == expected[payload["job_id"]]
        by_job.setdefault(payload["job_id"], set()).add(request.delivery_id)
    assert set(by_job) == set(expected)
    assert all(len(ids) == 1 for ids in by_job.values())
    accepted = Counter(r.delivery_id for r in hook.accepted())
    assert len(accepted) == JOBS
    async with clean_db.connect() as conn:
        states = (
            await conn.execute(text("SELECT state, count(*) FROM webhook_deliveries GROUP BY 1"))
        ).all()
    assert dict(states) == {"delivered": JOBS}


async def test_a_loopback_callback_is_refused_by_default(
    jobq_servers: JobqServers, clean_db: AsyncEngine
) -> None:
    server = await jobq_servers.start({"JOBQ_WEBHOOK_SECRET": SECRET})
    async with receiver() as hook, httpx.AsyncClient(base_url=server.url, timeout=10) as client:
        r = await client.post("/v1/jobs", json={"type": "t", "callback_url": hook.url()})
        assert r.status_code == 422, r.text
        assert "loopback" in r.json()["errors"][0]["message"]
    assert hook.received == []
