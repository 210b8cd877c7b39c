"""SIGTERM to a real ``jobq worker`` mid-job: the job is released with its checkpoint at once."""

from __future__ import annotations

import signal
import time
from datetime import datetime
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from jobq_client import Client, JobContext, Worker
from tests.acceptance import chunked_worker
from tests.polling import poll_until
from tests.processes import JobqServers, WorkerProcesses
from tests.workers import RunningWorker

pytestmark = pytest.mark.acceptance

TARGET = "tests.acceptance.chunked_worker:worker"


async def test_sigterm_releases_the_job_with_its_checkpoint_and_the_next_worker_resumes(
    jobq_servers: JobqServers, worker_processes: WorkerProcesses, clean_db: AsyncEngine
) -> None:
    server = await jobq_servers.start()
    process = worker_processes.start(TARGET, server.url)
    async with Client(server.url) as client:
        job = await client.enqueue(
            "chunked",
            {"chunks": 100_000, "chunk_seconds": 0.05},
            queue=chunked_worker.QUEUE,
        )

        async def chunks_done() -> bool:
            assert process.process.poll() is None, process.log_text()
            seen = await client.get_job(job["id"])
            return seen["status"] == "running" and (seen["checkpoint"] or {}).get("next", 0) >= 5

        await poll_until(chunks_done, within=30, what="the worker process to save 5 chunks")
        running = await client.get_job(job["id"])
        assert running["attempts"] == 1
        lease_left = datetime.fromisoformat(running["lease_expires_at"]) - datetime.fromisoformat(
            running["updated_at"]
        )
        assert lease_left.total_seconds() > chunked_worker.LEASE_SECONDS - 5, lease_left

        signalled = time.monotonic()
        process.process.send_signal(signal.SIGTERM)

        async def released() -> bool:
            return (await client.get_job(job["id"]))["status"] != "running"

        await poll_until(released, within=5, what="the job to be released", interval=0.02)
        released_after = time.monotonic() - signalled
        back = await client.get_job(job["id"])
        exit_code = await process.wait_exit(15)

        # A second worker takes it at once and receives the checkpoint.
        second = Worker(server.url, queues=[chunked_worker.QUEUE], lease_seconds=30, wait_seconds=5)
        resumed: list[tuple[Any, int, float]] = []

        @second.handler("chunked")
        async def resume(ctx: JobContext) -> Any:
            resumed.append((ctx.checkpoint, ctx.attempt, time.monotonic()))
            return {"resumed_from": ctx.checkpoint}

        started = time.monotonic()
        async with RunningWorker(second) as running_second:
            await poll_until(lambda: bool(resumed), within=5, what="the second worker to claim")
            await poll_until(
                lambda: not second.running_job_ids, within=5, what="the job to be completed"
            )
            await running_second.stop()
        done = await client.get_job(job["id"])

    log = process.log_text()
    assert exit_code == 0, log
    # Released right after the signal, not after the 60 s lease.
    assert back["status"] == "pending", back
    assert released_after < 3, released_after
    assert back["lease_expires_at"] is None and back["attempts"] == 0
    checkpoint = back["checkpoint"]
    assert checkpoint["next"] >= 5 and back["progress"]["done"] == checkpoint["next"]
    assert "stopping" in log
    [(resumed_checkpoint, attempt, claimed_at)] = resumed
    assert resumed_checkpoint == checkpoint and attempt == 1
    assert claimed_at - started < 1.0, claimed_at - started
    assert done["status"] == "succeeded" and done["result"] == {"resumed_from": checkpoint}
