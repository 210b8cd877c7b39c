"""The reaper with nothing expired reads nothing, however many jobs are running.

Its index walk must be bounded by the expiry (an index condition), not filtered after reading:
a comparison against a materialized CTE's column gave the scan an order but no bound, so every
tick read every running job.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import NullPool

from app.db import async_url
from bench.plans import explain, rows_touched
from tests.integration.helpers import PLAN_SERVERS, migrated_database, stores

RUNNING = 3000


@pytest.fixture(scope="module", params=PLAN_SERVERS)
def running_url(request: pytest.FixtureRequest, pg_server_url: str) -> Iterator[str]:
    yield from migrated_database(request.param, pg_server_url, "jobq_reaper")


@pytest.fixture(scope="module")
async def running(running_url: str) -> AsyncIterator[AsyncEngine]:
    engine = create_async_engine(async_url(running_url), poolclass=NullPool)
    async with engine.begin() as conn:
        await conn.execute(
            text(
                "INSERT INTO jobs (queue, type, max_attempts, lease_seconds, status, attempts, "
                "lease_id, worker_id, lease_expires_at, started_at) "
                "SELECT 'q', 't', 5, 300, 'running', 1, gen_random_uuid(), 'w', "
                "now() + interval '5 minutes' + g * interval '1 ms', now() "
                "FROM generate_series(1, :n) g"
            ),
            {"n": RUNNING},
        )
        await conn.execute(text("ANALYZE jobs"))
    yield engine
    await engine.dispose()


async def test_nothing_expired_reads_no_running_job(running: AsyncEngine) -> None:
    repo = stores().maintenance
    async with running.connect() as conn:
        [plan] = await explain(conn, lambda c: repo.job_reap(c, batch_size=500))
    assert rows_touched(plan.plan) <= 1, plan.plan


async def test_expired_leases_are_read_up_to_the_batch(running: AsyncEngine) -> None:
    repo = stores().maintenance
    async with running.connect() as conn:
        await conn.execute(
            text(
                "UPDATE jobs SET lease_expires_at = now() - interval '1 second' "
                "WHERE id IN (SELECT id FROM jobs ORDER BY id LIMIT 20)"
            )
        )
        await conn.commit()
        [plan] = await explain(conn, lambda c: repo.job_reap(c, batch_size=500))
    assert plan.plan.get("Actual Rows") == 20, plan.plan
    # The expired twenty, read by the walk and again by the update's join, not the 3,000.
    assert rows_touched(plan.plan) <= 3 * 20, plan.plan
