"""The Client's wait and enqueue_and_wait against the real service."""

from __future__ import annotations

import asyncio
import time

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from app.api.state import app_state
from jobq_client import Client, JobqError, WaitTimeout
from tests.api.client_helpers import running_service
from tests.polling import poll_until


async def _complete_next(client: Client, queue: str, result: object) -> int:
    """Claims the next job of ``queue`` (long-polling) and completes it with ``result``."""
    [job] = await client.claim("w1", [queue], wait_seconds=10)
    [done] = await client.complete(
        "w1", [{"job_id": job["id"], "lease_id": job["lease_id"], "result": result}]
    )
    assert done["ok"] is True
    job_id: int = job["id"]
    return job_id


async def test_enqueue_and_wait_answers_the_finished_job(
    database_url: str, clean_db: AsyncEngine
) -> None:
    async with (
        running_service(database_url) as service,
        service.client() as producer,
        service.client() as worker,
    ):
        working = asyncio.create_task(_complete_next(worker, "rpc", {"sum": 3}))
        job = await producer.enqueue_and_wait("add", {"a": 1, "b": 2}, queue="rpc", timeout=10)
        assert job["status"] == "succeeded" and job["result"] == {"sum": 3}
        assert await working == job["id"]


async def test_wait_answers_at_once_for_a_finished_job_and_for_dead_ones(
    database_url: str, clean_db: AsyncEngine
) -> None:
    async with running_service(database_url) as service, service.client() as client:
        job = await client.enqueue("t", queue="q", max_attempts=1)
        [held] = await client.claim("w1", ["q"])
        await client.fail(
            "w1", [{"job_id": held["id"], "lease_id": held["lease_id"], "error": "x"}]
        )
        started = time.monotonic()
        dead = await client.wait(job["id"], timeout=10)
        assert dead["status"] == "dead" and dead["last_error"] == "x"
        assert time.monotonic() - started < 2


async def test_wait_loops_over_rounds_and_answers_when_the_job_finishes(
    database_url: str, clean_db: AsyncEngine
) -> None:
    async with (
        running_service(database_url) as service,
        service.client() as producer,
        service.client() as worker,
    ):
        job = await producer.enqueue("t", queue="q")
        # Rounds of 0.2 s: the job finishes during a later round, not the first.
        waiting = asyncio.create_task(producer.wait(job["id"], timeout=10, poll_seconds=0.2))
        results = app_state(service.app).running().services.results.hub
        calls = service.transports[0]

        async def rounds() -> bool:
            return calls.count(f"/v1/jobs/{job['id']}") >= 3

        await poll_until(rounds, within=5, what="a few rounds of waiting")
        assert not waiting.done() and results.parked <= 1
        await _complete_next(worker, "q", "done")
        got = await asyncio.wait_for(waiting, 5)
        assert got["status"] == "succeeded" and got["result"] == "done"


async def test_wait_raises_wait_timeout_with_the_unfinished_job(
    database_url: str, clean_db: AsyncEngine
) -> None:
    async with running_service(database_url) as service, service.client() as client:
        job = await client.enqueue("t", queue="q")
        started = time.monotonic()
        with pytest.raises(WaitTimeout) as timed_out:
            await client.wait(job["id"], timeout=0.5)
        assert 0.45 <= time.monotonic() - started < 3
        assert isinstance(timed_out.value, TimeoutError)
        assert timed_out.value.job_id == job["id"] and timed_out.value.job is not None
        assert timed_out.value.job["status"] == "pending"
        # The job goes on: an enqueue_and_wait with its idempotency key waits for it again.
        with pytest.raises(WaitTimeout):
            await client.enqueue_and_wait("t", queue="q", idempotency_key="k", timeout=0.2)


async def test_wait_for_an_unknown_job_raises_the_404(
    database_url: str, clean_db: AsyncEngine
) -> None:
    async with running_service(database_url) as service, service.client() as client:
        with pytest.raises(JobqError) as missing:
            await client.wait(999_999, timeout=5)
        assert missing.value.status == 404
