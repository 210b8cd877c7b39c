"""The Worker against a scripted service on httpx.MockTransport: batching, verdicts, lease loss, stop.

The fake answers the wire protocol only as far as these tests need; what the service itself does
with leases is tested against PostgreSQL in tests/api/test_client_*.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from typing import Any

import httpx
import pytest

from jobq_client import Client, JobContext, LeaseLost, NonRetryableError, Worker
from jobq_client.cli import TargetError, load_worker, run_worker
from jobq_client.leases import LeaseKeeper
from tests.polling import poll_until
from tests.workers import RunningWorker

Json = dict[str, Any]


class FakeService:
    """Hands out queued jobs on claim (long-polling while none), and answers lease calls per item."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Json]] = []
        self.queued: list[Json] = []
        self.lost: set[int] = set()
        self.cancelled: set[int] = set()
        self.claim_errors: list[Exception | int] = []
        self.heartbeat_errors: list[Exception | int] = []
        self.claim_status = 200
        self.statuses: dict[str, str] = {}  # path -> the "status" its ok results carry
        self._changed = asyncio.Event()
        self._next_id = 1

    def add(self, type: str = "t", payload: Any = None, checkpoint: Any = None) -> int:
        job_id = self._next_id
        self._next_id += 1
        self.queued.append(
            {
                "id": job_id,
                "type": type,
                "payload": payload,
                "attempt": 1,
                "lease_id": str(uuid.uuid4()),
                "checkpoint": checkpoint,
                "status": "running",
            }
        )
        self._changed.set()
        return job_id

    def bodies(self, path: str) -> list[Json]:
        return [body for p, body in self.calls if p == path]

    def items(self, path: str, job_id: int | None = None) -> list[Json]:
        return [
            item
            for body in self.bodies(path)
            for item in body["leases"]
            if job_id is None or item["job_id"] == job_id
        ]

    @staticmethod
    def _error(error: Exception | int) -> httpx.Response:
        if isinstance(error, Exception):
            raise error
        return httpx.Response(error, json={"title": "Service Unavailable", "detail": "try again"})

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        body: Json = json.loads(request.content)
        self.calls.append((path, body))
        if path == "/v1/claim":
            if self.claim_errors:
                return self._error(self.claim_errors.pop(0))
            if self.claim_status != 200:
                return httpx.Response(self.claim_status, json={"title": "Unprocessable"})
            if not self.queued:
                self._changed.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), body["wait_seconds"])
            jobs, self.queued = self.queued[: body["max_jobs"]], self.queued[body["max_jobs"] :]
            return httpx.Response(200, json={"jobs": jobs})
        if path == "/v1/heartbeat" and self.heartbeat_errors:
            return self._error(self.heartbeat_errors.pop(0))
        results = []
        for item in body["leases"]:
            job_id = item["job_id"]
            held = job_id not in self.lost and job_id not in self.cancelled
            result: Json = {
                "job_id": job_id,
                "ok": held,
                "error": None if held else "lease_lost",
                "cancelled": job_id in self.cancelled,
            }
            if held and path in self.statuses:
                result["status"] = self.statuses[path]
            results.append(result)
        return httpx.Response(200, json={"results": results})


def make_worker(service: FakeService, **options: Any) -> Worker:
    settings: Json = {
        "queues": ["q"],
        "concurrency": 4,
        "lease_seconds": 3,
        "heartbeat_interval": 0.05,
        "grace_seconds": 5.0,
        "wait_seconds": 10.0,
        "worker_id": "w-test",
        **options,
    }
    return Worker("http://jobq.test", transport=httpx.MockTransport(service), **settings)


async def test_one_heartbeat_request_carries_every_held_lease() -> None:
    service = FakeService()
    ids = [service.add(payload=n) for n in range(3)]
    worker = make_worker(service, lease_seconds=3, heartbeat_interval=0.05)
    proceed = asyncio.Event()

    @worker.handler("t")
    async def handle(ctx: JobContext) -> Any:
        await proceed.wait()
        return {"double": ctx.payload * 2}

    async with RunningWorker(worker) as running:
        await poll_until(lambda: len(service.bodies("/v1/heartbeat")) >= 3)
        proceed.set()
        await poll_until(lambda: len(service.items("/v1/complete")) == 3)
        await running.stop(within=5)
    beats = service.bodies("/v1/heartbeat")
    full = [b for b in beats if len(b["leases"]) == 3]
    assert len(full) >= 3, beats
    for body in full:
        assert body["worker_id"] == "w-test"
        assert sorted(item["job_id"] for item in body["leases"]) == ids
        assert all(item["lease_seconds"] == 3 and item["lease_id"] for item in body["leases"])
    # Never one request per lease while all three were held.
    assert all(len(b["leases"]) == 3 for b in beats[: len(full)])
    assert {i["job_id"]: i["result"] for i in service.items("/v1/complete")} == {
        ids[0]: {"double": 0},
        ids[1]: {"double": 2},
        ids[2]: {"double": 4},
    }


@pytest.mark.parametrize(
    ("raised", "retryable", "error"),
    [
        (ValueError("boom"), True, ("ValueError", "boom")),
        (
            NonRetryableError("bad input"),
            False,
            ("jobq_client.errors.NonRetryableError", "bad input"),
        ),
    ],
)
async def test_handler_exception_fails_the_job(
    raised: Exception, retryable: bool, error: tuple[str, str]
) -> None:
    service = FakeService()
    job_id = service.add()
    worker = make_worker(service)

    @worker.handler("t")
    async def handle(ctx: JobContext) -> Any:
        raise raised

    async with RunningWorker(worker) as running:
        await poll_until(lambda: bool(service.items("/v1/fail")))
        await running.stop(within=5)
    [fail] = service.items("/v1/fail")
    assert fail["job_id"] == job_id and fail["retryable"] is retryable
    # The exception as the service groups failures: its type, message and traceback.
    assert (fail["error"]["type"], fail["error"]["message"]) == error
    assert fail["error"]["traceback"].startswith("Traceback (most recent call last)")
    assert fail["error"]["traceback"].rstrip().endswith(f"{type(raised).__name__}: {error[1]}")
    assert "raise raised" in fail["error"]["traceback"]
    assert not service.items("/v1/complete") and not service.items("/v1/release")


async def test_an_unknown_job_type_is_released_with_a_delay_and_never_failed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    service = FakeService()
    job_id = service.add(type="mystery")
    worker = make_worker(service, unknown_type_delay_seconds=42)

    @worker.handler("known")
    async def handle(ctx: JobContext) -> Any:
        return None

    with caplog.at_level(logging.WARNING, logger="jobq_client.worker"):
        async with RunningWorker(worker) as running:
            await poll_until(lambda: bool(service.items("/v1/release")))
            await running.stop(within=5)
    [release] = service.items("/v1/release")
    assert release["job_id"] == job_id and release["delay_seconds"] == 42
    assert not service.items("/v1/fail")
    [warning] = [r.getMessage() for r in caplog.records if "no handler" in r.getMessage()]
    assert "'mystery'" in warning and f"job {job_id}" in warning and "known" in warning


def test_the_unknown_type_delay_must_be_one_the_service_takes() -> None:
    with pytest.raises(ValueError, match="unknown_type_delay_seconds"):
        make_worker(FakeService(), unknown_type_delay_seconds=-1)
    with pytest.raises(ValueError, match="unknown_type_delay_seconds"):
        make_worker(FakeService(), unknown_type_delay_seconds=31 * 24 * 3600)


async def test_a_result_that_is_not_json_fails_the_job_instead_of_completing() -> None:
    service = FakeService()
    service.add()
    worker = make_worker(service)

    @worker.handler("t")
    async def handle(ctx: JobContext) -> Any:
        return {"when": object()}

    async with RunningWorker(worker) as running:
        await poll_until(lambda: bool(service.items("/v1/fail")))
        await running.stop(within=5)
    [fail] = service.items("/v1/fail")
    assert fail["retryable"] is False and "not JSON" in fail["error"]
    assert not service.items("/v1/complete")


@pytest.mark.parametrize("cancelled", [False, True])
async def test_a_lost_lease_cancels_the_handler_and_the_job_is_never_settled(
    cancelled: bool,
) -> None:
    service = FakeService()
    doomed = service.add(payload="doomed")
    worker = make_worker(service, concurrency=2)
    seen: dict[str, Any] = {}
    handler_cancelled = asyncio.Event()
    proceed_other = asyncio.Event()

    @worker.handler("t")
    async def handle(ctx: JobContext) -> Any:
        if ctx.payload != "doomed":
            await proceed_other.wait()
            return "fine"
        seen["ctx"] = ctx
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            handler_cancelled.set()
            raise

    async with RunningWorker(worker) as running:
        await poll_until(lambda: "ctx" in seen)
        (service.cancelled if cancelled else service.lost).add(doomed)
        await asyncio.wait_for(handler_cancelled.wait(), 5)
        # The worker carries on with other jobs.
        other = service.add(payload="other")
        await poll_until(lambda: bool(service.items("/v1/heartbeat", other)))
        proceed_other.set()
        await poll_until(lambda: bool(service.items("/v1/complete", other)))
        await running.stop(within=5)
    assert seen["ctx"].cancelled is cancelled
    for path in ("/v1/complete", "/v1/fail", "/v1/release"):
        assert not service.items(path, doomed), path
    # Once a heartbeat answered lost for it, the lease is left out of every later heartbeat.
    beats = [body for path, body in service.calls if path == "/v1/heartbeat"]
    carrying = [
        n for n, body in enumerate(beats) if doomed in {i["job_id"] for i in body["leases"]}
    ]
    assert carrying and len(beats) > carrying[-1] + 1
    assert carrying == list(range(carrying[0], carrying[-1] + 1))


async def test_save_checkpoint_on_a_lost_lease_raises_lease_lost_past_except_exception() -> None:
    service = FakeService()
    job_id = service.add()
    worker = make_worker(service, lease_seconds=30, heartbeat_interval=10)
    outcome: dict[str, Any] = {}
    proceed = asyncio.Event()

    @worker.handler("t")
    async def handle(ctx: JobContext) -> Any:
        await ctx.save_checkpoint({"step": 1}, progress={"done": 1})
        outcome["first"] = ctx.checkpoint
        await proceed.wait()
        try:
            await ctx.save_checkpoint({"step": 2})
        except Exception:  # noqa: BLE001 - the point: this must not catch LeaseLost
            outcome["swallowed"] = True
        except LeaseLost:
            outcome["lost"] = True
            raise
        return "done"

    async with RunningWorker(worker) as running:
        await poll_until(lambda: "first" in outcome)
        service.lost.add(job_id)
        proceed.set()
        await poll_until(lambda: "lost" in outcome or "swallowed" in outcome)
        await running.stop(within=5)
    assert outcome == {"first": {"step": 1}, "lost": True}
    first, second = [i for i in service.items("/v1/heartbeat", job_id) if "checkpoint" in i]
    assert first["checkpoint"] == {"step": 1} and first["progress"] == {"done": 1}
    assert second["checkpoint"] == {"step": 2} and "progress" not in second
    for path in ("/v1/complete", "/v1/fail", "/v1/release"):
        assert not service.items(path, job_id), path


async def test_never_runs_more_than_concurrency_jobs_and_claims_only_free_slots() -> None:
    service = FakeService()
    for n in range(7):
        service.add(payload=n)
    worker = make_worker(service, concurrency=2)
    running_now = 0
    most = 0
    gates = [asyncio.Event() for _ in range(7)]

    @worker.handler("t")
    async def handle(ctx: JobContext) -> Any:
        nonlocal running_now, most
        running_now += 1
        most = max(most, running_now)
        try:
            await gates[ctx.payload].wait()
        finally:
            running_now -= 1
        return ctx.payload

    async with RunningWorker(worker) as running:
        for gate in gates:
            await poll_until(lambda: running_now == 2 or len(service.items("/v1/complete")) >= 6)
            gate.set()
        await poll_until(lambda: len(service.items("/v1/complete")) == 7)
        await running.stop(within=5)
    assert most == 2
    claims = service.bodies("/v1/claim")
    assert all(1 <= c["max_jobs"] <= 2 for c in claims)
    assert sorted(i["result"] for i in service.items("/v1/complete")) == list(range(7))


async def test_stop_saves_the_checkpoint_then_releases_the_job_with_it() -> None:
    service = FakeService()
    job_id = service.add(checkpoint={"chunk": 4})
    worker = make_worker(service, grace_seconds=10, wait_seconds=20)
    seen: dict[str, Any] = {}

    @worker.handler("t")
    async def handle(ctx: JobContext) -> Any:
        chunk = ctx.checkpoint["chunk"]
        seen["start"] = chunk
        while True:
            await asyncio.sleep(0.01)  # one chunk of work
            chunk += 1
            seen["stopping_seen"] = ctx.stopping
            await ctx.save_checkpoint({"chunk": chunk}, progress=chunk)

    async with RunningWorker(worker) as running:
        await poll_until(lambda: len(service.items("/v1/heartbeat", job_id)) >= 3)
        claims_before = len(service.bodies("/v1/claim"))
        started = time.monotonic()
        await running.stop(within=5)
        # The parked 20 s long-poll was cancelled, not waited out.
        assert time.monotonic() - started < 3
    assert seen["start"] == 4 and seen["stopping_seen"] is True
    assert len(service.bodies("/v1/claim")) == claims_before
    [release] = service.items("/v1/release")
    saves = [i for i in service.items("/v1/heartbeat", job_id) if "checkpoint" in i]
    last_saved = saves[-1]["checkpoint"]
    assert release == {
        "job_id": job_id,
        "lease_id": release["lease_id"],
        "checkpoint": last_saved,
    }
    assert last_saved["chunk"] > 4
    assert not service.items("/v1/complete") and not service.items("/v1/fail")


async def test_a_handler_finishing_within_the_grace_period_completes() -> None:
    service = FakeService()
    job_id = service.add()
    worker = make_worker(service, grace_seconds=10)
    contexts: list[JobContext] = []
    finish = asyncio.Event()

    @worker.handler("t")
    async def handle(ctx: JobContext) -> Any:
        contexts.append(ctx)
        await finish.wait()
        return {"stopping": ctx.stopping}

    async with RunningWorker(worker) as running:
        await poll_until(lambda: bool(contexts))
        claims = len(service.bodies("/v1/claim"))
        worker.stop()
        await poll_until(lambda: contexts[0].stopping)
        finish.set()
        await running.stop(within=5)
    [complete] = service.items("/v1/complete")
    assert complete["job_id"] == job_id and complete["result"] == {"stopping": True}
    assert not service.items("/v1/release")
    assert len(service.bodies("/v1/claim")) == claims


async def test_after_the_grace_period_handlers_are_cancelled_and_released_without_checkpoint() -> (
    None
):
    service = FakeService()
    job_id = service.add(checkpoint={"saved": 1})
    worker = make_worker(service, grace_seconds=0.2)
    started = asyncio.Event()
    cancelled = asyncio.Event()

    @worker.handler("t")
    async def handle(ctx: JobContext) -> Any:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    async with RunningWorker(worker) as running:
        await asyncio.wait_for(started.wait(), 5)
        await running.stop(within=5)
    assert cancelled.is_set()
    [release] = service.items("/v1/release")
    assert release["job_id"] == job_id and "checkpoint" not in release


async def test_transient_claim_and_heartbeat_errors_are_retried() -> None:
    service = FakeService()
    service.claim_errors = [httpx.ConnectError("refused"), 503, 500]
    service.heartbeat_errors = [httpx.ReadTimeout("slow"), 502]
    job_id = service.add()
    worker = make_worker(service, heartbeat_interval=0.05)
    proceed = asyncio.Event()

    @worker.handler("t")
    async def handle(ctx: JobContext) -> Any:
        await proceed.wait()
        return "ok"

    async with RunningWorker(worker) as running:
        await poll_until(lambda: not service.heartbeat_errors, within=10)
        await poll_until(lambda: bool(service.items("/v1/heartbeat", job_id)))
        proceed.set()
        await poll_until(lambda: bool(service.items("/v1/complete", job_id)), within=10)
        await running.stop(within=5)
    assert [i["result"] for i in service.items("/v1/complete")] == ["ok"]


async def test_a_claim_refused_with_4xx_stops_the_worker_with_the_error() -> None:
    service = FakeService()
    service.claim_status = 422
    worker = make_worker(service)
    with pytest.raises(Exception) as caught:
        await asyncio.wait_for(worker.run(install_signal_handlers=False), 5)
    assert getattr(caught.value, "status", None) == 422


async def test_stop_before_run_makes_run_return_at_once() -> None:
    service = FakeService()
    worker = make_worker(service, wait_seconds=20)
    worker.stop()
    await asyncio.wait_for(worker.run(install_signal_handlers=False), 3)


def test_heartbeat_interval_defaults_to_a_third_of_the_lease_and_may_not_exceed_it() -> None:
    assert Worker(lease_seconds=30).heartbeat_interval == 10
    assert Worker(lease_seconds=3, heartbeat_interval=1).heartbeat_interval == 1
    with pytest.raises(ValueError, match="heartbeat_interval"):
        Worker(lease_seconds=3, heartbeat_interval=1.5)
    with pytest.raises(ValueError, match="concurrency"):
        Worker(concurrency=0)
    worker = Worker()
    with pytest.raises(TypeError, match="async"):
        worker.handler("t")(lambda ctx: None)  # type: ignore[arg-type,return-value]


async def test_a_context_outside_a_worker_records_its_checkpoint() -> None:
    ctx = JobContext({"id": 3, "type": "t", "payload": 1, "attempt": 2, "checkpoint": {"n": 1}})
    assert (ctx.job_id, ctx.attempt, ctx.payload, ctx.checkpoint) == (3, 2, 1, {"n": 1})
    await ctx.save_checkpoint({"n": 2}, progress=0.5)
    assert ctx.checkpoint == {"n": 2} and ctx.progress == 0.5
    assert not ctx.cancelled and not ctx.stopping


def test_a_context_outside_a_worker_can_be_told_to_stop_or_that_it_was_cancelled() -> None:
    ctx = JobContext({"id": 3, "type": "t"})
    ctx.mark_stopping()
    assert ctx.stopping and not ctx.cancelled
    ctx.mark_cancelled()
    assert ctx.stopping and ctx.cancelled


@pytest.mark.parametrize("status", ["pending", "scheduled"])
async def test_a_failed_job_is_settled_once_whatever_status_the_service_names(status: str) -> None:
    service = FakeService()
    service.statuses["/v1/fail"] = status
    failing = service.add(payload="fail")
    worker = make_worker(service, concurrency=1)

    @worker.handler("t")
    async def handle(ctx: JobContext) -> Any:
        if ctx.payload == "fail":
            raise ValueError("try later")
        return "fine"

    async with RunningWorker(worker) as running:
        await poll_until(lambda: bool(service.items("/v1/fail", failing)))
        # The slot is free again: the next job is claimed and completed.
        other = service.add(payload="other")
        await poll_until(lambda: bool(service.items("/v1/complete", other)))
        await running.stop(within=5)
    assert len(service.items("/v1/fail", failing)) == 1
    assert not service.items("/v1/complete", failing) and not service.items("/v1/release", failing)


async def test_the_lease_keeper_fails_a_job_for_good_when_its_complete_is_refused() -> None:
    sent: list[tuple[str, Json]] = []

    def answer(request: httpx.Request) -> httpx.Response:
        body: Json = json.loads(request.content)
        sent.append((request.url.path, body))
        if request.url.path == "/v1/complete":
            return httpx.Response(413, json={"title": "Content Too Large", "detail": "result"})
        return httpx.Response(200, json={"results": [{"job_id": 7, "ok": True}]})

    async def returns() -> Any:
        return {"huge": "result"}

    async with Client("http://jobq.test", transport=httpx.MockTransport(answer)) as client:
        keeper = LeaseKeeper(client, worker_id="w-test", lease_seconds=3, heartbeat_interval=1)
        held = keeper.hold({"id": 7, "type": "t", "lease_id": "lease-7"})
        assert len(keeper) == 1 and keeper.jobs() == [held]
        handler = asyncio.create_task(returns())
        await asyncio.wait([handler])
        await keeper.settle(held, handler)
        keeper.drop(held)
    assert [path for path, _ in sent] == ["/v1/complete", "/v1/fail"]
    [fail] = sent[1][1]["leases"]
    assert fail["job_id"] == 7 and fail["lease_id"] == "lease-7" and fail["retryable"] is False
    assert fail["error"].startswith("complete refused: 413")
    assert len(keeper) == 0


example_worker = Worker(queues=["example"])


def make_example_worker() -> Worker:
    return Worker(queues=["from-factory"])


def test_load_worker_takes_a_worker_or_a_factory_and_rejects_anything_else() -> None:
    assert load_worker(f"{__name__}:example_worker") is example_worker
    assert load_worker(f"{__name__}:make_example_worker").queues == ["from-factory"]
    bad_targets = [
        __name__,  # no attribute
        f"{__name__}:nothing",
        f"{__name__}:poll_until",  # an async function
        f"{__name__}:FakeService",  # a factory of something else
        f"{__name__}:make_worker",  # a factory that needs arguments
        "no_such_module_here:worker",
    ]
    for bad in bad_targets:
        with pytest.raises(TargetError):
            load_worker(bad)
    assert run_worker(f"{__name__}:nothing") == 2
