"""The Client and Worker against the real service composing work: workflows, batch callbacks,
ordering keys and jobs that depend on others."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from jobq_client import (
    Callback,
    EnqueuedBatch,
    JobContext,
    JobqError,
    NonRetryableError,
    Step,
    WorkflowWaitTimeout,
)
from tests.api.client_helpers import running_service
from tests.workers import RunningWorker

QUEUE = "composing"


async def test_a_three_step_workflow_runs_each_step_on_its_parents_result(
    database_url: str, clean_db: AsyncEngine
) -> None:
    async with running_service(database_url) as service:
        worker, _ = service.worker(queues=[QUEUE], concurrency=4, wait_seconds=1)
        seen: dict[str, Any] = {}

        @worker.handler("fetch")
        async def fetch(ctx: JobContext) -> Any:
            seen["fetch"] = (ctx.parents, ctx.parent_results)
            return {"rows": ctx.payload["rows"]}

        @worker.handler("transform")
        async def transform(ctx: JobContext) -> Any:
            seen["transform"] = ctx.parents
            return {"doubled": [2 * r for r in ctx.parent_results["fetch"]["rows"]]}

        @worker.handler("load")
        async def load(ctx: JobContext) -> Any:
            seen["load"] = await ctx.fetch_parent_results()
            return {"loaded": sum(ctx.parent_results["transform"]["doubled"])}

        async with service.client() as client, RunningWorker(worker):
            created = await client.workflow(
                "etl",
                [
                    Step("fetch", "fetch", payload={"rows": [1, 2, 3]}, queue=QUEUE),
                    # A dict works as well as a Step.
                    {"name": "transform", "type": "transform", "queue": QUEUE, "after": ["fetch"]},
                    Step("load", "load", after=("transform",), queue=QUEUE, max_attempts=2),
                ],
            )
            assert created["name"] == "etl" and created["state"] == "running"
            assert [s["name"] for s in created["steps"]] == ["fetch", "transform", "load"]
            assert [s["after"] for s in created["steps"]] == [[], ["fetch"], ["transform"]]
            statuses = [s["job"]["status"] for s in created["steps"]]
            assert statuses[0] in {"pending", "running"} and statuses[1:] == ["waiting"] * 2
            assert created["steps"][2]["job"]["max_attempts"] == 2

            finished = await client.wait_workflow(created["id"], timeout=15)

        assert finished["state"] == "succeeded", finished
        assert finished["counts"] == {"succeeded": 3}
        results = {s["name"]: s["job"]["result"] for s in finished["steps"]}
        assert results == {
            "fetch": {"rows": [1, 2, 3]},
            "transform": {"doubled": [2, 4, 6]},
            "load": {"loaded": 12},
        }
        assert seen["fetch"] == (None, {})  # the first step waited for nobody
        parents = seen["transform"]
        assert (parents["total"], parents["succeeded"], parents["failed_ids"]) == (1, 1, [])
        assert parents["jobs"][0]["step"] == "fetch"
        assert parents["jobs"][0]["id"] == created["steps"][0]["job"]["id"]
        assert seen["load"] == {"transform": {"doubled": [2, 4, 6]}}


async def test_a_batch_callback_sees_the_counts_and_the_failed_ids(
    database_url: str, clean_db: AsyncEngine
) -> None:
    async with running_service(database_url) as service:
        worker, _ = service.worker(queues=[QUEUE], concurrency=4, wait_seconds=1)
        told: list[dict[str, Any]] = []

        @worker.handler("part")
        async def part(ctx: JobContext) -> Any:
            if ctx.payload == "bad":
                raise NonRetryableError("this part is broken")
            return {"part": ctx.payload}

        @worker.handler("report")
        async def report(ctx: JobContext) -> Any:
            assert ctx.parents is not None
            told.append(ctx.parents)
            return {"ok": ctx.parents["succeeded"]}

        async with service.client() as client:
            batch = await client.enqueue_batch(
                [
                    {"type": "part", "queue": QUEUE, "payload": "a"},
                    {"type": "part", "queue": QUEUE, "payload": "bad", "max_attempts": 1},
                    {"type": "part", "queue": QUEUE, "payload": "c"},
                ],
                callback=Callback("report", {"for": "parts"}, when="all_finished", queue=QUEUE),
            )
            # Still the list of the batch's jobs it always was, with the callback beside it.
            assert isinstance(batch, EnqueuedBatch) and isinstance(batch, list)
            assert [j["payload"] for j in batch] == ["a", "bad", "c"]
            assert batch.callback is not None
            assert batch.callback["status"] == "waiting"
            assert batch.callback["depends_on"] == [j["id"] for j in batch]
            assert batch.callback["on_parent_failure"] == "run"

            async with RunningWorker(worker):
                callback = await client.wait(batch.callback["id"], timeout=15)

            plain = await client.enqueue_batch([{"type": "part", "queue": QUEUE}])
            assert plain.callback is None

        assert callback["status"] == "succeeded" and callback["result"] == {"ok": 2}
        [parents] = told
        assert (parents["total"], parents["succeeded"], parents["dead"]) == (3, 2, 1)
        assert parents["cancelled"] == 0
        assert parents["failed_ids"] == [batch[1]["id"]]
        assert [p["status"] for p in parents["jobs"]] == ["succeeded", "dead", "succeeded"]
        assert [p["result"] for p in parents["jobs"]] == [{"part": "a"}, None, {"part": "c"}]


async def test_a_callback_given_as_a_dict_waits_for_all_to_succeed(
    database_url: str, clean_db: AsyncEngine
) -> None:
    async with running_service(database_url) as service, service.client() as client:
        jobs = [{"type": "part", "queue": QUEUE, "idempotency_key": f"part-{n}"} for n in range(2)]
        callback = {"type": "report", "queue": QUEUE, "idempotency_key": "report-1"}
        batch = await client.enqueue_batch(jobs, callback=callback)
        assert batch.callback is not None and batch.callback["on_parent_failure"] == "cancel"
        # The same request again is a replay: the same jobs and the same callback.
        again = await client.enqueue_batch(jobs, callback=callback)
        assert [j["id"] for j in again] == [j["id"] for j in batch]
        assert again.callback is not None and again.callback["id"] == batch.callback["id"]

        await client.cancel(batch[0]["id"])
        assert (await client.get_job(batch.callback["id"]))["status"] == "cancelled"


async def test_jobs_of_one_ordering_key_run_one_at_a_time_in_order(
    database_url: str, clean_db: AsyncEngine
) -> None:
    async with running_service(database_url) as service:
        worker, _ = service.worker(queues=[QUEUE], concurrency=4, wait_seconds=1)
        started: dict[str, list[int]] = {}
        running: dict[str, int] = {}
        most: dict[str, int] = {}

        @worker.handler("step")
        async def step(ctx: JobContext) -> Any:
            key = ctx.job["ordering_key"]
            started.setdefault(key, []).append(ctx.payload)
            running[key] = running.get(key, 0) + 1
            most[key] = max(most.get(key, 0), running[key])
            await asyncio.sleep(0.02)
            running[key] -= 1
            return ctx.payload

        async with service.client() as client:
            ids = []
            for n in range(6):
                for key in ("account:1", "account:2"):
                    job = await client.enqueue("step", n, queue=QUEUE, ordering_key=key)
                    assert job["ordering_key"] == key
                    ids.append(job["id"])
            async with RunningWorker(worker):
                for job_id in ids:
                    assert (await client.wait(job_id, timeout=15))["status"] == "succeeded"

        assert started == {"account:1": list(range(6)), "account:2": list(range(6))}
        assert most == {"account:1": 1, "account:2": 1}


async def test_depends_on_refuses_what_the_service_refuses_as_a_jobq_error(
    database_url: str, clean_db: AsyncEngine
) -> None:
    async with running_service(database_url) as service, service.client() as client:
        with pytest.raises(JobqError) as unknown:
            await client.enqueue("child", queue=QUEUE, depends_on=[999_999])
        assert unknown.value.status == 422
        assert [e["field"] for e in unknown.value.errors] == ["body.depends_on[0]"]
        with pytest.raises(JobqError) as in_batch:
            await client.enqueue_batch([{"type": "child", "depends_on": (999_999,)}])
        assert [e["field"] for e in in_batch.value.errors] == ["body.jobs[0].depends_on[0]"]
        with pytest.raises(JobqError) as both:
            parent = await client.enqueue("parent", queue=QUEUE)
            await client.enqueue("child", depends_on=[parent["id"]], ordering_key="k")
        assert both.value.status == 422
        with pytest.raises(JobqError) as cycle:
            await client.workflow(
                "loop", [Step("a", "t", after=["b"]), Step("b", "t", after=["a"])]
            )
        assert cycle.value.status == 422

        child = await client.enqueue(
            "child", queue=QUEUE, depends_on=[parent["id"]], on_parent_failure="run"
        )
        assert child["status"] == "waiting" and child["depends_on"] == [parent["id"]]
        assert child["on_parent_failure"] == "run"
        await client.cancel(parent["id"])
        assert (await client.get_job(child["id"]))["status"] == "pending"


async def test_a_failed_workflow_is_retried_and_a_stuck_one_cancelled(
    database_url: str, clean_db: AsyncEngine
) -> None:
    async with running_service(database_url) as service:
        worker, _ = service.worker(queues=[QUEUE], concurrency=2, wait_seconds=1)
        broken = {"b": True}

        @worker.handler("t")
        async def handle(ctx: JobContext) -> Any:
            if ctx.job["workflow_step"] == "b" and broken["b"]:
                raise NonRetryableError("b is broken")
            return ctx.job["workflow_step"]

        async with service.client() as client, RunningWorker(worker):
            steps = [
                Step("a", "t", queue=QUEUE),
                Step("b", "t", after=["a"], queue=QUEUE, max_attempts=1),
                Step("c", "t", after=["b"], queue=QUEUE),
            ]
            created = await client.workflow("fragile", steps)
            failed = await client.wait_workflow(created["id"], timeout=15)
            assert failed["state"] == "failed"
            assert failed["counts"] == {"succeeded": 1, "dead": 1, "cancelled": 1}

            broken["b"] = False
            retried = await client.retry_workflow(created["id"])
            assert retried["workflow_id"] == created["id"] and retried["changed"] == 2
            assert set(retried["steps"]) == {"b", "c"}
            done = await client.wait_workflow(created["id"], timeout=15)
            assert done["state"] == "succeeded"
            assert [s["job"]["result"] for s in done["steps"]] == ["a", "b", "c"]

        async with service.client() as client:
            # No worker runs "nobody" jobs: the workflow stays running until cancelled.
            stuck = await client.workflow(
                "stuck", [Step("x", "nobody", queue=QUEUE), Step("y", "nobody", after=["x"])]
            )
            with pytest.raises(WorkflowWaitTimeout) as timed_out:
                await client.wait_workflow(stuck["id"], timeout=0.3, poll_seconds=0.1)
            assert timed_out.value.workflow is not None
            assert timed_out.value.workflow["state"] == "running"
            assert isinstance(timed_out.value, TimeoutError)
            cancelled = await client.cancel_workflow(stuck["id"])
            assert cancelled["changed"] == 2
            assert cancelled["steps"] == {"x": "cancelled", "y": "cancelled"}
            final = await client.wait_workflow(stuck["id"], timeout=1)
            assert final["state"] == "cancelled"
            assert (await client.get_workflow(stuck["id"]))["counts"] == {"cancelled": 2}
            with pytest.raises(JobqError) as missing:
                await client.get_workflow(999_999)
            assert missing.value.status == 404
