"""A worker whose lease was lost (expired, reaped, claimed by another) stops and changes nothing."""

from __future__ import annotations

import asyncio
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from jobq_client import JobContext, LeaseLost
from tests.api.client_helpers import running_service
from tests.polling import poll_until
from tests.workers import RunningWorker

QUEUE = "lost"


async def test_stale_worker_cannot_complete_or_overwrite_the_new_owners_checkpoint(
    database_url: str, clean_db: AsyncEngine
) -> None:
    async with running_service(database_url) as service:
        # A heartbeat interval far beyond the test: the stale worker learns of the loss only
        # from its own complete and save_checkpoint calls.
        stale, calls = service.worker(
            queues=[QUEUE], concurrency=2, lease_seconds=60, heartbeat_interval=20, wait_seconds=1
        )
        started: dict[str, JobContext] = {}
        proceed = asyncio.Event()
        outcome: dict[str, Any] = {}

        @stale.handler("work")
        async def work(ctx: JobContext) -> Any:
            mode = ctx.payload["mode"]
            await ctx.save_checkpoint({"by": "stale", "step": 1})
            started[mode] = ctx
            await proceed.wait()
            if mode == "complete":
                return "stale result"
            try:
                await ctx.save_checkpoint({"by": "stale", "step": 2})
            except LeaseLost:
                outcome["lost"] = True
                raise
            outcome["saved"] = True
            return "stale result"

        async with service.client() as client, RunningWorker(stale) as running:
            to_complete = await client.enqueue("work", {"mode": "complete"}, queue=QUEUE)
            to_save = await client.enqueue("work", {"mode": "checkpoint"}, queue=QUEUE)
            await poll_until(lambda: len(started) == 2, within=5, what="both handlers to start")

            # Both leases expire; the reaper returns the jobs; another worker claims them.
            new_leases = {}
            for job in (to_complete, to_save):
                await service.expire_and_reap(clean_db, job["id"])
                [claimed] = await client.claim("new-owner", [QUEUE], lease_seconds=60)
                assert claimed["id"] == job["id"] and claimed["attempt"] == 2
                assert claimed["checkpoint"] == {"by": "stale", "step": 1}
                ref = {"job_id": claimed["id"], "lease_id": claimed["lease_id"]}
                [saved] = await client.heartbeat(
                    "new-owner", [{**ref, "checkpoint": {"by": "new-owner"}}]
                )
                assert saved["ok"]
                new_leases[job["id"]] = ref

            proceed.set()
            await poll_until(
                lambda: not stale.running_job_ids, within=5, what="the stale worker to let go"
            )
            after_complete = await client.get_job(to_complete["id"])
            after_save = await client.get_job(to_save["id"])
            await running.stop()

            # The new owner still holds both and can finish them.
            results = await client.complete(
                "new-owner", [{**ref, "result": "new result"} for ref in new_leases.values()]
            )
            assert all(r["ok"] for r in results), results

        assert outcome == {"lost": True}
        # The stale complete was sent and refused: the job is still the new owner's.
        [stale_complete] = calls.items("/v1/complete", to_complete["id"])
        assert stale_complete["result"] == "stale result"
        for job in (after_complete, after_save):
            assert job["status"] == "running" and job["worker_id"] == "new-owner"
            assert job["lease_id"] == new_leases[job["id"]]["lease_id"]
            assert job["result"] is None and job["attempts"] == 2
            assert job["checkpoint"] == {"by": "new-owner"}
        # The stale save_checkpoint was sent and changed nothing; nothing else was sent for it.
        saves = [i for i in calls.items("/v1/heartbeat", to_save["id"]) if "checkpoint" in i]
        assert [i["checkpoint"]["step"] for i in saves] == [1, 2]
        for path in ("/v1/complete", "/v1/fail", "/v1/release"):
            assert not calls.items(path, to_save["id"]), path
        for path in ("/v1/fail", "/v1/release"):
            assert not calls.items(path, to_complete["id"]), path


async def test_heartbeat_answered_lease_lost_cancels_the_handler(
    database_url: str, clean_db: AsyncEngine
) -> None:
    async with running_service(database_url) as service:
        stale, calls = service.worker(
            queues=[QUEUE], lease_seconds=3, heartbeat_interval=0.2, wait_seconds=1
        )
        contexts: list[JobContext] = []
        handler_cancelled = asyncio.Event()

        @stale.handler("work")
        async def work(ctx: JobContext) -> Any:
            contexts.append(ctx)
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                handler_cancelled.set()
                raise

        async with service.client() as client, RunningWorker(stale) as running:
            job = await client.enqueue("work", queue=QUEUE)
            await poll_until(lambda: bool(contexts), within=5, what="the handler to start")
            await poll_until(
                lambda: bool(calls.items("/v1/heartbeat", job["id"])),
                within=5,
                what="a first heartbeat",
            )
            await service.expire_and_reap(clean_db, job["id"])
            [claimed] = await client.claim("new-owner", [QUEUE], lease_seconds=60)
            ref = {"job_id": claimed["id"], "lease_id": claimed["lease_id"]}
            await client.heartbeat("new-owner", [{**ref, "checkpoint": {"by": "new-owner"}}])

            await asyncio.wait_for(handler_cancelled.wait(), 5)
            after = await client.get_job(job["id"])
            await running.stop()

        assert contexts[0].cancelled is False
        assert after["status"] == "running" and after["worker_id"] == "new-owner"
        assert after["lease_id"] == claimed["lease_id"] and after["checkpoint"] == {
            "by": "new-owner"
        }
        for path in ("/v1/complete", "/v1/fail", "/v1/release"):
            assert not calls.items(path, job["id"]), path
