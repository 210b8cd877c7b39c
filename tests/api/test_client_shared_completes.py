"""The Worker's shared completes and claim-ahead against the real service: every job runs once,
never more handlers than the concurrency, and far fewer requests than jobs."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from jobq_client import JobContext, tracing
from tests.api.client_helpers import running_service
from tests.api.test_client_claim_next import finished
from tests.polling import poll_until
from tests.workers import RunningWorker

QUEUE = "shared"


@pytest.fixture(autouse=True)
def without_opentelemetry(monkeypatch: pytest.MonkeyPatch) -> None:
    """As in an application without OpenTelemetry: a traced job's complete goes alone (its own
    ``traceparent``), and another test module may have set a global SDK for the session."""
    monkeypatch.setattr(tracing, "trace", None)


async def test_a_wide_worker_claiming_ahead_completes_jobs_in_shared_requests(
    database_url: str, clean_db: AsyncEngine
) -> None:
    jobs, concurrency = 60, 8
    async with running_service(database_url) as service:
        worker, calls = service.worker(
            queues=[QUEUE], concurrency=concurrency, claim_ahead=concurrency, wait_seconds=1
        )
        running_now = most = 0
        ran: list[int] = []

        @worker.handler("work")
        async def work(ctx: JobContext) -> Any:
            nonlocal running_now, most
            running_now += 1
            most = max(most, running_now)
            try:
                await asyncio.sleep(0.002 * (ctx.payload % 3))
            finally:
                running_now -= 1
            ran.append(ctx.job_id)
            return {"n": ctx.payload}

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
            results = [(await client.get_job(i))["result"] for i in ids]

    assert sorted(ran) == sorted(ids)  # each job ran once
    assert results == [{"n": n} for n in range(jobs)]
    assert most <= concurrency
    completes = [body for path, body in calls.calls if path == "/v1/complete"]
    assert sum(len(body["leases"]) for body in completes) == jobs
    assert len(completes) < jobs  # shared: several jobs a request
    assert all(
        body["claim_next"]["max_jobs"] <= 2 * concurrency
        for body in completes
        if "claim_next" in body
    )
