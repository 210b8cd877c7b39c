"""A job enqueued by jobq.enqueue() wakes a parked claim when its producer commits.

The instance hears the function's ``jobq_wakeup`` notification on its control connection: the
backstop here re-checks only every 20 s, longer than the claim waits, so a claim answered with
the job was woken by the commit. The instance also writes its own bounds for the function.
"""

from __future__ import annotations

import asyncio
import json

import asyncpg
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from app.api.state import app_state
from tests.api.client_helpers import running_service
from tests.polling import poll_until

BACKSTOP_SECONDS = 20.0  # the longest the setting allows: longer than any wait below


async def _reset_limits(database_url: str) -> None:
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute("DELETE FROM jobq.enqueue_limits")
        await conn.execute("INSERT INTO jobq.enqueue_limits DEFAULT VALUES")
    finally:
        await conn.close()


async def test_a_parked_claim_wakes_when_the_producer_commits(
    database_url: str, clean_db: AsyncEngine
) -> None:
    async with (
        running_service(database_url, longpoll_backstop_seconds=BACKSTOP_SECONDS) as service,
        service.client() as client,
    ):
        hub = app_state(service.app).running().hub
        claim = asyncio.create_task(client.claim("w1", ["emails"], wait_seconds=15))
        await poll_until(lambda: hub.parked == 1, within=10, what="the claim to park")
        producer = await asyncpg.connect(database_url)
        try:
            async with producer.transaction():
                job_id = await producer.fetchval(
                    "SELECT jobq.enqueue('emails', 'receipt', $1::jsonb)", json.dumps({"o": 1})
                )
                # Not before the commit: the job is invisible and nothing has been sent.
                await asyncio.sleep(0)
                assert not claim.done()
        finally:
            await producer.close()
        jobs = await asyncio.wait_for(claim, timeout=30)
        assert [j["id"] for j in jobs] == [job_id]
        assert jobs[0]["payload"] == {"o": 1}


async def test_an_instance_writes_its_bounds_for_the_function(
    database_url: str, clean_db: AsyncEngine
) -> None:
    try:
        async with running_service(
            database_url, queue_name_max_chars=8, max_attempts_default=4, lease_seconds_default=45
        ):
            conn = await asyncpg.connect(database_url)
            try:
                with pytest.raises(asyncpg.InvalidParameterValueError) as refused:
                    await conn.fetchval("SELECT jobq.enqueue('ninechars', 't')")
                assert "at most 8 characters" in str(refused.value)
                job_id = await conn.fetchval("SELECT jobq.enqueue('eight888', 't')")
                row = await conn.fetchrow(
                    "SELECT max_attempts, lease_seconds FROM jobs WHERE id = $1", job_id
                )
                assert (row["max_attempts"], row["lease_seconds"]) == (4, 45)
            finally:
                await conn.close()
    finally:
        await _reset_limits(database_url)
