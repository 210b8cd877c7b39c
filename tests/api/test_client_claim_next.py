"""The client's ``claim_next`` against the real service: one request per job for a busy worker."""

from __future__ import annotations

import asyncio
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from jobq_client import JobContext
from tests.api.client_helpers import running_service
from tests.polling import poll_until
from tests.workers import RunningWorker

QUEUE = "chained"


async def finished(engine: AsyncEngine, ids: list[int]) -> bool:
    async with engine.connect() as conn:
        open_jobs = (
            await conn.execute(
                text("SELECT count(*) FROM jobs WHERE id = ANY(:ids) AND status <> 'succeeded'"),
                {"ids": ids},
            )
        ).scalar_one()
    return bool(open_jobs == 0)


async def test_a_worker_of_concurrency_1_makes_one_request_per_job(
    database_url: str, clean_db: AsyncEngine
) -> None:
    jobs = 12
    async with running_service(database_url) as service:
        worker, calls = service.worker(
            queues=[QUEUE], concurrency=1, lease_seconds=30, wait_seconds=5
        )
        ran: list[int] = []

        @worker.handler("square")
        async def square(ctx: JobContext) -> Any:
            ran.append(ctx.job_id)
            return ctx.payload * ctx.payload

        async with service.client() as client:
            batch = await client.enqueue_batch(
                [{"type": "square", "payload": n, "queue": QUEUE} for n in range(jobs)]
            )
            ids = [job["id"] for job in batch]
            async with RunningWorker(worker) as running:
                await poll_until(
                    lambda: finished(clean_db, ids), within=20, what="every job to succeed"
                )
                await running.stop()
            results = [(await client.get_job(i))["result"] for i in ids]

    assert sorted(ran) == sorted(ids)  # each job ran once
    assert results == [n * n for n in range(jobs)]
    # The first claim, then one complete per job, each claiming the next; at most one more
    # claim (the long-poll after the queue ran dry), never one per job.
    assert calls.count("/v1/complete") == jobs
    assert 1 <= calls.count("/v1/claim") <= 2
    requests = [path for path, _ in calls.calls if path != "/v1/heartbeat"]
    assert len(requests) <= jobs + 2, requests
    bodies = [body for path, body in calls.calls if path == "/v1/complete"]
    assert all(
        body["claim_next"] == {"queues": [QUEUE], "max_jobs": 1, "lease_seconds": 30}
        for body in bodies
    ), bodies


async def test_a_worker_chaining_claims_never_runs_more_than_its_concurrency(
    database_url: str, clean_db: AsyncEngine
) -> None:
    jobs = 30
    async with running_service(database_url, backoff_base_seconds=0.05) as service:
        worker, calls = service.worker(
            queues=[QUEUE], concurrency=3, lease_seconds=30, wait_seconds=1
        )
        running_now = 0
        most = 0
        attempts: dict[int, int] = {}

        @worker.handler("work")
        async def work(ctx: JobContext) -> Any:
            nonlocal running_now, most
            running_now += 1
            most = max(most, running_now)
            try:
                await asyncio.sleep(0.01 * (ctx.payload % 4))  # a slice of work
            finally:
                running_now -= 1
            attempts[ctx.job_id] = ctx.attempt
            if ctx.payload % 5 == 0 and ctx.attempt == 1:
                raise ValueError("once")  # failed, retried: a fail carries claim_next too
            return ctx.payload

        async with service.client() as client:
            batch = await client.enqueue_batch(
                [{"type": "work", "payload": n, "queue": QUEUE} for n in range(jobs)]
            )
            ids = [job["id"] for job in batch]
            async with RunningWorker(worker) as running:
                await poll_until(
                    lambda: finished(clean_db, ids), within=30, what="every job to succeed"
                )
                await running.stop()

    assert most <= 3
    assert sorted(attempts) == sorted(ids)
    assert all(attempts[i] == (2 if n % 5 == 0 else 1) for n, i in enumerate(ids))
    fails = [body for path, body in calls.calls if path == "/v1/fail"]
    assert len(fails) == jobs // 5 and all("claim_next" in body for body in fails)
    settles = calls.count("/v1/complete") + len(fails)
    # Most jobs came with a settle call, not with a claim of their own.
    assert calls.count("/v1/claim") < settles / 2, calls.count("/v1/claim")
    assert all(
        1 <= body["claim_next"]["max_jobs"] <= 3
        for path, body in calls.calls
        if path in ("/v1/complete", "/v1/fail")
    )
