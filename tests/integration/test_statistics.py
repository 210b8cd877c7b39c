"""The statistics loop ANALYZEs jobs where autovacuum will not, and only then.

The hot pool plans from these statistics once per connection: with none, claims over a large
backlog sorted it on every call (app/maintenance/statistics.py).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.maintenance.statistics import JobStatistics
from app.queue.services import Services
from tests.polling import poll_until

ROWS = 3_000


async def _insert_and_flush(engine: AsyncEngine) -> None:
    """Inserts ROWS pending jobs; the session's counts reach pg_stat_user_tables at its commit."""
    async with engine.begin() as conn:
        await conn.execute(
            text(
                "INSERT INTO jobs (queue, type, status, max_attempts, lease_seconds) "
                "SELECT 'stats', 't', 'pending', 10, 30 FROM generate_series(1, :n)"
            ),
            {"n": ROWS},
        )
        await conn.execute(text("SELECT pg_stat_force_next_flush()"))


async def _analyzed(engine: AsyncEngine) -> tuple[float, bool]:
    """jobs' row estimate, and whether it was ever analyzed by hand (not by autovacuum)."""
    async with engine.connect() as conn:
        row = (
            await conn.execute(
                text(
                    "SELECT c.reltuples, s.last_analyze IS NOT NULL FROM pg_class c "
                    "JOIN pg_stat_user_tables s ON s.relid = c.oid "
                    "WHERE c.oid = CAST('jobs' AS regclass)"
                )
            )
        ).one()
    return float(row[0]), bool(row[1])


@pytest.fixture
async def autovacuum_for_jobs(clean_db: AsyncEngine) -> AsyncIterator[AsyncEngine]:
    """The session's database with a fresh analyze of jobs, its autovacuum reset afterwards."""
    async with clean_db.begin() as conn:
        await conn.execute(text("ANALYZE jobs"))
    yield clean_db
    async with clean_db.begin() as conn:
        await conn.execute(text("ALTER TABLE jobs RESET (autovacuum_enabled)"))


async def test_with_autovacuum_off_for_jobs_the_leader_analyzes_it_once_enough_changed(
    autovacuum_for_jobs: AsyncEngine, svc: Services
) -> None:
    engine = autovacuum_for_jobs
    async with engine.begin() as conn:
        await conn.execute(text("ALTER TABLE jobs SET (autovacuum_enabled = false)"))
    loop = JobStatistics(services=svc)
    assert await loop.run_batch() == 0  # just analyzed: nothing changed since
    await _insert_and_flush(engine)

    async def analyzed_now() -> bool:
        return await loop.run_batch() == 1

    await poll_until(analyzed_now, within=20, what="the loop to analyze jobs")
    reltuples, by_hand = await _analyzed(engine)
    assert by_hand and reltuples >= ROWS  # the planner now knows of the backlog
    assert await loop.run_batch() == 0  # and not again until as much changes again


async def _last_analyze(engine: AsyncEngine) -> object:
    async with engine.connect() as conn:
        return (
            await conn.execute(
                text("SELECT last_analyze FROM pg_stat_user_tables WHERE relname = 'jobs'")
            )
        ).scalar_one()


async def test_where_autovacuum_runs_it_decides_alone(
    autovacuum_for_jobs: AsyncEngine, svc: Services
) -> None:
    """With autovacuum on for the table, the loop analyzes only if the server's is off."""
    engine = autovacuum_for_jobs
    async with engine.connect() as conn:
        server_on = (await conn.execute(text("SHOW autovacuum"))).scalar_one() == "on"
    before = await _last_analyze(engine)  # the fixture's ANALYZE, by hand as the loop's is
    loop = JobStatistics(services=svc)
    await _insert_and_flush(engine)
    analyzed = await loop.run_batch()
    if server_on:  # autovacuum may analyze meanwhile; the loop never does
        assert analyzed == 0 and await _last_analyze(engine) == before
    else:
        assert analyzed == 1 and await _last_analyze(engine) != before
