"""The Worker's ``claim_next`` against a scripted service: what it asks, and what it does when the
service refuses it or a stop comes while it is in flight."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx

from jobq_client import Client, JobContext
from tests.polling import poll_until
from tests.unit.test_client_worker import FakeService, make_worker
from tests.workers import RunningWorker

Json = dict[str, Any]
SETTLES = ("/v1/complete", "/v1/fail", "/v1/release")


class ChainingService(FakeService):
    """The fake service, answering ``claim_next`` on settle calls from its queue (or refusing it
    as a service from before it does); ``gate``, when set, holds those answers until it opens."""

    def __init__(self, *, refuse: bool = False) -> None:
        super().__init__()
        self.refuse = refuse
        self.gate: asyncio.Event | None = None

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        body: Json = json.loads(request.content)
        ask = body.get("claim_next")
        if request.url.path not in SETTLES or ask is None:
            return await super().__call__(request)
        if self.refuse:
            self.calls.append((request.url.path, body))
            return httpx.Response(
                422,
                json={
                    "title": "Unprocessable Content",
                    "status": 422,
                    "errors": [
                        {"field": "body.claim_next", "message": "Extra inputs are not permitted"}
                    ],
                },
            )
        answered = await super().__call__(request)
        if self.gate is not None:
            await self.gate.wait()
        jobs, self.queued = self.queued[: ask["max_jobs"]], self.queued[ask["max_jobs"] :]
        return httpx.Response(200, json={**answered.json(), "claimed": {"jobs": jobs}})


async def test_a_busy_worker_of_concurrency_1_sends_one_request_per_job() -> None:
    service = ChainingService()
    ids = [service.add(payload=n) for n in range(5)]
    worker = make_worker(service, concurrency=1)

    @worker.handler("t")
    async def handle(ctx: JobContext) -> Any:
        return ctx.payload

    async with RunningWorker(worker) as running:
        await poll_until(lambda: len(service.items("/v1/complete")) == 5)
        await running.stop(within=5)
    assert [i["job_id"] for i in service.items("/v1/complete")] == ids
    claims = service.bodies("/v1/claim")
    assert len(claims) <= 2  # the first, and the long-poll once the queue ran dry
    assert all(
        b["claim_next"] == {"queues": ["q"], "max_jobs": 1, "lease_seconds": 3}
        for b in service.bodies("/v1/complete")
    )


async def test_a_service_that_refuses_claim_next_gets_the_settle_alone_from_then_on() -> None:
    service = ChainingService(refuse=True)
    ids = [service.add(payload=n) for n in range(3)]
    worker = make_worker(service, concurrency=1)

    @worker.handler("t")
    async def handle(ctx: JobContext) -> Any:
        return ctx.payload

    async with RunningWorker(worker) as running:
        await poll_until(lambda: len(service.items("/v1/complete")) >= 4)
        await running.stop(within=5)
    completes = service.bodies("/v1/complete")
    # Refused once, sent again without it; never asked again; every job completed once.
    assert "claim_next" in completes[0] and all("claim_next" not in b for b in completes[1:])
    assert [b["leases"][0]["job_id"] for b in completes[1:]] == ids
    assert not service.bodies("/v1/fail")


async def test_jobs_claimed_by_a_settle_that_answers_after_the_stop_are_handed_back() -> None:
    service = ChainingService()
    first = service.add()
    worker = make_worker(service, concurrency=1, grace_seconds=5)
    service.gate = asyncio.Event()
    ran: list[int] = []

    @worker.handler("t")
    async def handle(ctx: JobContext) -> Any:
        ran.append(ctx.job_id)
        return "done"

    async with RunningWorker(worker) as running:
        await poll_until(lambda: bool(service.bodies("/v1/complete")))
        late = service.add()  # claimed by the complete held at the gate
        worker.stop()
        service.gate.set()
        await running.stop(within=5)
    assert ran == [first]
    [release] = service.bodies("/v1/release")
    assert [item["job_id"] for item in release["leases"]] == [late]
    assert "claim_next" not in release


async def test_the_client_answers_the_claimed_jobs_beside_the_results() -> None:
    service = ChainingService()
    job = service.add()
    nxt = service.add()
    async with Client("http://jobq.test", transport=httpx.MockTransport(service)) as client:
        [held] = await client.claim("w", ["q"])
        plain = await client.heartbeat("w", [{"job_id": held["id"], "lease_id": held["lease_id"]}])
        assert getattr(plain, "claimed", None) is None
        results = await client.complete(
            "w",
            [{"job_id": held["id"], "lease_id": held["lease_id"]}],
            claim_next={"queues": ["q"], "max_jobs": 5},
        )
    assert [r["job_id"] for r in results] == [job]
    assert results.claimed is not None and [j["id"] for j in results.claimed] == [nxt]
    assert results.claim_error is None
