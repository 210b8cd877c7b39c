"""jobq_client with API keys: a producer key enqueues, a worker key runs the job, no key is refused."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from app.api.state import app_state
from app.auth.keys import Role
from jobq_client import Client, JobContext, JobqError, Worker
from tests.api.client_helpers import BASE_URL, running_service
from tests.keys import make_key
from tests.polling import poll_until


async def test_keys_carry_a_job_from_producer_to_worker(
    database_url: str, clean_db: AsyncEngine
) -> None:
    async with running_service(database_url) as service:
        producer_key = await make_key(clean_db, "shop", Role.PRODUCER, ["emails"])
        worker_key = await make_key(clean_db, "mailer", Role.WORKER, ["emails"])
        await app_state(service.app).running().keys.refresh()

        async with Client(BASE_URL, transport=service.transport()) as anonymous:
            with pytest.raises(JobqError) as refused:
                await anonymous.enqueue("welcome", queue="emails")
            assert refused.value.status == 401
        async with Client(
            BASE_URL, transport=service.transport(), api_key=producer_key
        ) as producer:
            job = await producer.enqueue("welcome", {"user": 1}, queue="emails")

        done: list[int] = []
        worker = Worker(
            BASE_URL,
            transport=service.transport(),
            api_key=worker_key,
            queues=["emails"],
            wait_seconds=1,
        )

        @worker.handler("welcome")
        async def welcome(ctx: JobContext) -> dict[str, bool]:
            done.append(ctx.job_id)
            return {"sent": True}

        running = asyncio.create_task(worker.run())
        async with Client(
            BASE_URL, transport=service.transport(), api_key=producer_key
        ) as producer:

            async def succeeded() -> bool:
                return (await producer.get_job(job["id"]))["status"] == "succeeded"

            await poll_until(succeeded, within=10, what="the job to succeed")
        worker.stop()
        await running
        assert done == [job["id"]]
