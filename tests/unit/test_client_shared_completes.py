"""The Worker completes the jobs whose handlers returned while a complete was in flight in one
request (against a scripted service): each job's own result, a claim for the slots they free, and
each job on its own when the service refuses the shared request."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

from jobq_client import JobContext, Worker, tracing
from jobq_client.worker import worker_pool
from tests.polling import poll_until
from tests.unit.test_client_claim_next import ChainingService
from tests.unit.test_client_worker import make_worker
from tests.workers import RunningWorker

Json = dict[str, Any]


@pytest.fixture(autouse=True)
def without_opentelemetry(monkeypatch: pytest.MonkeyPatch) -> None:
    """As in an application without OpenTelemetry: a traced job's complete goes alone (its own
    ``traceparent``), and another test module may have set a global SDK for the session."""
    monkeypatch.setattr(tracing, "trace", None)


class RefusingShared(ChainingService):
    """Refuses (422, as for a result too large) any complete that carries more than one lease."""

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        body: Json = json.loads(request.content)
        if request.url.path == "/v1/complete" and len(body["leases"]) > 1:
            self.calls.append((request.url.path, body))
            return httpx.Response(
                422, json={"title": "Unprocessable Content", "status": 422, "errors": []}
            )
        return await super().__call__(request)


async def hold_first_complete(service: ChainingService, concurrency: int) -> tuple[Worker, Json]:
    """A worker of ``concurrency`` whose first job returns at once while the others wait for
    ``release``; the first complete is held at the service's gate. Answers the worker and the
    test's shared state (``release``, ``running``, ``most``)."""
    worker = make_worker(service, concurrency=concurrency)
    service.gate = asyncio.Event()
    state: Json = {"release": asyncio.Event(), "running": 0, "most": 0}

    @worker.handler("t")
    async def handle(ctx: JobContext) -> Any:
        state["running"] += 1
        state["most"] = max(state["most"], state["running"])
        try:
            if ctx.payload != 0:
                await state["release"].wait()
        finally:
            state["running"] -= 1
        return {"n": ctx.payload}

    return worker, state


async def test_handlers_returning_while_a_complete_is_out_share_the_next_request() -> None:
    service = ChainingService()
    ids = [service.add(payload=n) for n in range(4)]
    worker, state = await hold_first_complete(service, concurrency=4)

    async with RunningWorker(worker) as running:
        await poll_until(lambda: len(service.bodies("/v1/complete")) == 1)
        state["release"].set()  # the other three return while the first complete is held
        await poll_until(lambda: state["running"] == 0)
        service.gate.set()
        await poll_until(lambda: len(service.items("/v1/complete")) == 4)
        await running.stop(within=5)

    first, shared = service.bodies("/v1/complete")
    assert [item["job_id"] for item in first["leases"]] == ids[:1]
    assert [item["job_id"] for item in shared["leases"]] == ids[1:]
    # Each job carries its own handler's result.
    assert [item["result"] for item in shared["leases"]] == [{"n": n} for n in (1, 2, 3)]
    # The shared request claims for the slots it frees, never past the concurrency.
    assert 1 <= shared["claim_next"]["max_jobs"] <= 4
    assert state["most"] <= 4
    assert not service.bodies("/v1/fail")


async def test_a_shared_complete_the_service_refuses_is_sent_again_job_by_job() -> None:
    service = RefusingShared()
    ids = [service.add(payload=n) for n in range(3)]
    worker, state = await hold_first_complete(service, concurrency=3)

    async with RunningWorker(worker) as running:
        await poll_until(lambda: len(service.bodies("/v1/complete")) == 1)
        state["release"].set()
        await poll_until(lambda: state["running"] == 0)
        service.gate.set()
        await poll_until(
            lambda: (
                sorted(
                    b["leases"][0]["job_id"]
                    for b in service.bodies("/v1/complete")
                    if len(b["leases"]) == 1
                )
                == ids
            )
        )
        await running.stop(within=5)

    shared = [b for b in service.bodies("/v1/complete") if len(b["leases"]) > 1]
    # Refused with claim_next, then without it; then each job alone, none failed.
    assert [[i["job_id"] for i in b["leases"]] for b in shared] == [ids[1:], ids[1:]]
    assert "claim_next" in shared[0] and "claim_next" not in shared[1]
    alone = [b["leases"][0] for b in service.bodies("/v1/complete") if len(b["leases"]) == 1]
    assert {i["job_id"]: i["result"] for i in alone} == {i: {"n": n} for n, i in enumerate(ids)}
    assert not service.bodies("/v1/fail")


async def test_a_stop_while_a_shared_complete_is_out_hands_back_what_it_claimed() -> None:
    service = ChainingService()
    ids = [service.add(payload=n) for n in range(3)]
    worker, state = await hold_first_complete(service, concurrency=3)

    async with RunningWorker(worker) as running:
        await poll_until(lambda: len(service.bodies("/v1/complete")) == 1)
        late = service.add(payload=0)  # claimed by the held complete
        worker.stop()
        state["release"].set()
        service.gate.set()
        await running.stop(within=5)

    completed = sorted(item["job_id"] for item in service.items("/v1/complete"))
    assert completed == ids
    [release] = service.bodies("/v1/release")
    assert [item["job_id"] for item in release["leases"]] == [late]
    # Once stopping, no complete asks for more jobs.
    assert all("claim_next" not in b for b in service.bodies("/v1/complete")[1:])


def test_a_worker_keeps_every_connection_of_its_pool_alive() -> None:
    for concurrency in (1, 16, 128):
        pool = worker_pool(concurrency)
        assert pool.max_connections == pool.max_keepalive_connections
        assert pool.max_connections is not None and pool.max_connections <= 20


async def test_a_job_claimed_ahead_starts_before_the_complete_before_it_is_answered() -> None:
    service = ChainingService()
    ids = [service.add(payload=n) for n in range(3)]
    worker = make_worker(service, concurrency=1, claim_ahead=2)
    service.gate = asyncio.Event()
    started: list[int] = []
    running = most = 0

    @worker.handler("t")
    async def handle(ctx: JobContext) -> Any:
        nonlocal running, most
        running += 1
        most = max(most, running)
        started.append(ctx.job_id)
        await asyncio.sleep(0)  # let the others run, were any started too early
        running -= 1
        return ctx.payload

    async with RunningWorker(worker) as running_worker:
        # Every complete is held at the gate, yet each next job starts: it was claimed ahead.
        await poll_until(lambda: started == ids)
        assert service.items("/v1/complete")[0]["job_id"] == ids[0]
        service.gate.set()
        await poll_until(lambda: len(service.items("/v1/complete")) == 3)
        await running_worker.stop(within=5)

    assert most == 1  # never more handlers than the concurrency
    [first_claim, *_] = service.bodies("/v1/claim")
    assert first_claim["max_jobs"] == 3  # the running slot and two ahead
    asked = [
        b["claim_next"]["max_jobs"] for b in service.bodies("/v1/complete") if "claim_next" in b
    ]
    assert all(1 <= n <= 3 for n in asked)


async def test_a_stop_hands_back_the_jobs_claimed_ahead_at_once() -> None:
    service = ChainingService()
    ids = [service.add(payload=n) for n in range(3)]
    worker = make_worker(service, concurrency=1, claim_ahead=2, grace_seconds=5)
    release = asyncio.Event()
    ran: list[int] = []

    @worker.handler("t")
    async def handle(ctx: JobContext) -> Any:
        ran.append(ctx.job_id)
        await release.wait()
        return ctx.payload

    async with RunningWorker(worker) as running:
        await poll_until(lambda: ran == ids[:1] and len(worker.running_job_ids) == 3)
        worker.stop()
        # Handed back while the running job is still within its grace period.
        await poll_until(lambda: bool(service.bodies("/v1/release")))
        assert not service.bodies("/v1/complete")
        release.set()
        await running.stop(within=5)

    assert ran == ids[:1]
    [handed_back] = service.bodies("/v1/release")
    assert [item["job_id"] for item in handed_back["leases"]] == ids[1:]
    assert [item["job_id"] for item in service.items("/v1/complete")] == ids[:1]


def test_claim_ahead_must_be_one_a_claim_can_take() -> None:
    for wrong in (-1, 101):
        with pytest.raises(ValueError, match="claim_ahead"):
            make_worker(ChainingService(), claim_ahead=wrong)
