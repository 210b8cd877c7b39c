"""A Worker against the real service: results complete, errors retry or kill, cancels stop handlers."""

from __future__ import annotations

import asyncio
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from jobq_client import JobContext, NonRetryableError
from tests.api.client_helpers import running_service
from tests.polling import poll_until
from tests.workers import RunningWorker

QUEUE = "outcomes"


async def test_returned_value_completes_raised_error_retries_non_retryable_is_dead(
    database_url: str, clean_db: AsyncEngine
) -> None:
    async with running_service(database_url, backoff_base_seconds=0.05) as service:
        worker, calls = service.worker(
            queues=[QUEUE], lease_seconds=30, wait_seconds=1, worker_id="outcomes-worker"
        )
        attempts_seen: dict[int, list[int]] = {}

        @worker.handler("add")
        async def add(ctx: JobContext) -> Any:
            return {"sum": sum(ctx.payload)}

        @worker.handler("flaky")
        async def flaky(ctx: JobContext) -> Any:
            attempts_seen.setdefault(ctx.job_id, []).append(ctx.attempt)
            if ctx.attempt == 1:
                raise ValueError("flaky the first time")
            return "second time lucky"

        @worker.handler("broken")
        async def broken(ctx: JobContext) -> Any:
            raise NonRetryableError(f"cannot handle {ctx.payload!r}")

        async with service.client() as client, RunningWorker(worker) as running:
            added = await client.enqueue("add", [1, 2, 3], queue=QUEUE)
            retried = await client.enqueue("flaky", queue=QUEUE, max_attempts=3)
            dead = await client.enqueue("broken", "bad", queue=QUEUE, max_attempts=5)
            finished = {"succeeded", "dead"}

            async def all_finished() -> bool:
                jobs = [await client.get_job(j["id"]) for j in (added, retried, dead)]
                return all(j["status"] in finished for j in jobs)

            await poll_until(all_finished, within=10, what="the three jobs to finish")
            added, retried, dead = [await client.get_job(j["id"]) for j in (added, retried, dead)]
            await running.stop()

        assert added["status"] == "succeeded" and added["result"] == {"sum": 6}
        assert added["attempts"] == 1
        # The raised error failed attempt 1 (retry scheduled), attempt 2 completed.
        assert retried["status"] == "succeeded" and retried["result"] == "second time lucky"
        assert retried["attempts"] == 2 and attempts_seen[retried["id"]] == [1, 2]
        assert any(
            (e.get("type"), e.get("error")) == ("ValueError", "flaky the first time")
            for e in retried["errors"]
        )
        [first_fail] = calls.items("/v1/fail", retried["id"])
        assert first_fail["retryable"] is True
        # NonRetryableError: dead after one attempt of five.
        assert dead["status"] == "dead" and dead["attempts"] == 1
        # The exception line as Python prints it: a non-builtin type with its module.
        assert dead["last_error"] == "jobq_client.errors.NonRetryableError: cannot handle 'bad'"
        [dead_fail] = calls.items("/v1/fail", dead["id"])
        assert dead_fail["retryable"] is False


async def test_cancelling_a_running_job_cancels_its_handler(
    database_url: str, clean_db: AsyncEngine
) -> None:
    async with running_service(database_url) as service:
        worker, calls = service.worker(
            queues=[QUEUE], lease_seconds=3, heartbeat_interval=0.2, wait_seconds=1
        )
        contexts: list[JobContext] = []
        handler_cancelled = asyncio.Event()

        @worker.handler("endless")
        async def endless(ctx: JobContext) -> Any:
            contexts.append(ctx)
            await ctx.save_checkpoint({"started": True})
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                handler_cancelled.set()
                raise

        async with service.client() as client, RunningWorker(worker) as running:
            job = await client.enqueue("endless", queue=QUEUE)
            await poll_until(lambda: bool(contexts), within=5, what="the handler to start")
            cancelled = await client.cancel(job["id"])
            assert cancelled["status"] == "cancelled"
            await asyncio.wait_for(handler_cancelled.wait(), 5)
            final = await client.get_job(job["id"])
            await running.stop()

        assert contexts[0].cancelled is True
        assert final["status"] == "cancelled" and final["checkpoint"] == {"started": True}
        for path in ("/v1/complete", "/v1/fail", "/v1/release"):
            assert not calls.items(path, job["id"]), path


async def test_a_job_of_a_type_without_handler_goes_back_to_the_queue_for_a_worker_that_has_one(
    database_url: str, clean_db: AsyncEngine
) -> None:
    # A rolling deploy: the new type reaches an old worker first.
    async with running_service(database_url) as service:
        old_worker, old_calls = service.worker(
            queues=[QUEUE], wait_seconds=1, unknown_type_delay_seconds=1
        )

        @old_worker.handler("known")
        async def known(ctx: JobContext) -> Any:
            return None

        async with service.client() as client:
            job = await client.enqueue("brand-new", {"n": 1}, queue=QUEUE, max_attempts=1)
            async with RunningWorker(old_worker) as running:
                await poll_until(
                    lambda: bool(old_calls.items("/v1/release", job["id"])),
                    within=10,
                    what="the old worker to release the job",
                )
                await running.stop()
            released = await client.get_job(job["id"])
            # Even on its only attempt the job lives: the release charged nothing.
            assert released["status"] in {"scheduled", "pending"}
            assert released["last_error"] is None
            [release] = old_calls.items("/v1/release", job["id"])
            assert release["delay_seconds"] == 1
            assert not old_calls.items("/v1/fail", job["id"])

            new_worker, _ = service.worker(queues=[QUEUE], wait_seconds=1)

            @new_worker.handler("brand-new")
            async def brand_new(ctx: JobContext) -> Any:
                return {"done": ctx.payload["n"]}

            async with RunningWorker(new_worker) as running:
                done = await client.wait(job["id"], timeout=15)
                await running.stop()
        assert done["status"] == "succeeded" and done["result"] == {"done": 1}
