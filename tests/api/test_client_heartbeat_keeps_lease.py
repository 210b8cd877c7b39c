"""Heartbeats keep a long job's short lease alive against a live reaper: no second worker gets it."""

from __future__ import annotations

import asyncio
import time
from datetime import datetime
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from app.api.state import app_state
from jobq_client import JobContext
from tests.api.client_helpers import running_service
from tests.polling import poll_until
from tests.workers import RunningWorker

QUEUE = "long"
JOB_SECONDS = 20.0
LEASE_SECONDS = 3
WORK_SLICE_SECONDS = 0.1


async def test_a_20s_job_on_a_3s_lease_is_held_by_heartbeats_and_never_handed_out_twice(
    database_url: str, clean_db: AsyncEngine
) -> None:
    async with running_service(
        database_url, maintenance_enabled=True, reaper_interval_seconds=0.2
    ) as service:
        runner = app_state(service.app).running().runner
        await poll_until(lambda: runner.is_leader, within=10, what="maintenance to be elected")

        options: dict[str, Any] = {
            "queues": [QUEUE],
            "lease_seconds": LEASE_SECONDS,
            "heartbeat_interval": 1.0,
            "wait_seconds": 1.0,
        }
        holder, holder_calls = service.worker(worker_id="holder", **options)
        other, other_calls = service.worker(worker_id="other", **options)
        runs: list[tuple[str, int, int]] = []

        @holder.handler("long")
        async def long_job(ctx: JobContext) -> Any:
            runs.append(("holder", ctx.job_id, ctx.attempt))
            started = time.monotonic()
            for _ in range(int(JOB_SECONDS / WORK_SLICE_SECONDS)):
                await asyncio.sleep(WORK_SLICE_SECONDS)  # a slice of the job's work
            return {"worked_seconds": round(time.monotonic() - started)}

        @other.handler("long")
        async def stolen(ctx: JobContext) -> Any:
            runs.append(("other", ctx.job_id, ctx.attempt))
            return "must not run"

        async with service.client() as client:
            job = await client.enqueue("long", queue=QUEUE)
            async with RunningWorker(holder) as holding:
                await poll_until(lambda: bool(runs), within=5, what="the holder to start the job")
                async with RunningWorker(other) as polling:
                    expiries: list[datetime] = []

                    async def finished() -> bool:
                        seen = await client.get_job(job["id"])
                        if seen["status"] == "running":
                            assert seen["worker_id"] == "holder" and seen["attempts"] == 1, seen
                            expiries.append(datetime.fromisoformat(seen["lease_expires_at"]))
                            return False
                        assert seen["status"] == "succeeded", seen
                        return True

                    await poll_until(
                        finished, within=JOB_SECONDS + 10, what="the job to finish", interval=0.25
                    )
                    other_claims = other_calls.count("/v1/claim")
                    await polling.stop()
                await holding.stop()
            done = await client.get_job(job["id"])

    assert runs == [("holder", job["id"], 1)]
    assert done["status"] == "succeeded" and done["attempts"] == 1
    assert done["result"]["worked_seconds"] >= JOB_SECONDS
    # The other worker polled the queue all along and got nothing.
    assert other_claims >= JOB_SECONDS / 2, other_claims
    # The lease was renewed all along: it advanced far past the first 3 s.
    assert (expiries[-1] - expiries[0]).total_seconds() > JOB_SECONDS - 5
    beats = [b for p, b in holder_calls.calls if p == "/v1/heartbeat"]
    assert len(beats) >= JOB_SECONDS - 3 and all(
        item["lease_seconds"] == LEASE_SECONDS for b in beats for item in b["leases"]
    )
