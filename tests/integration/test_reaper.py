"""The reaper's run_once on rows either side of the deadline, on the last attempt, in batches."""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.maintenance.reaper import Reaper, ReaperConfig
from tests.integration.helpers import job_row, repository, seed_jobs


async def _running(engine: AsyncEngine, ids: list[int], *, expires: float, attempts: int) -> None:
    async with engine.begin() as conn:
        await conn.execute(
            text(
                "UPDATE jobs SET status = 'running', attempts = :attempts, worker_id = 'w', "
                "lease_id = gen_random_uuid(), lease_expires_at = now() + make_interval(secs => :expires)"
                " WHERE id = ANY(:ids)"
            ),
            {"ids": ids, "expires": expires, "attempts": attempts},
        )


def _reaper(engine: AsyncEngine, batch_size: int = 500) -> Reaper:
    return Reaper(
        engine=engine,
        repository=repository(),
        config=ReaperConfig(interval_seconds=1, batch_size=batch_size),
    )


async def test_reaps_only_expired_leases(clean_db: AsyncEngine) -> None:
    expired = await seed_jobs(clean_db, 3)
    alive = await seed_jobs(clean_db, 2)
    await _running(clean_db, expired, expires=-1.0, attempts=1)
    await _running(clean_db, alive, expires=60.0, attempts=1)

    counts = await _reaper(clean_db).run_once()

    assert (counts.retried, counts.dead) == (3, 0)
    for job_id in expired:
        row = await job_row(clean_db, job_id)
        assert row["status"] == "pending" and row["lease_expires_at"] is None
        assert row["last_error"] == "lease expired"
        assert row["errors"][-1]["kind"] == "lease_expired"
    for job_id in alive:
        assert (await job_row(clean_db, job_id))["status"] == "running"


async def test_first_attempt_backoff_is_at_most_one_second(clean_db: AsyncEngine) -> None:
    ids = await seed_jobs(clean_db, 20)
    await _running(clean_db, ids, expires=-1.0, attempts=1)
    await _reaper(clean_db).run_once()
    async with clean_db.connect() as conn:
        delays = (
            (await conn.execute(text("SELECT EXTRACT(EPOCH FROM run_at - updated_at) FROM jobs")))
            .scalars()
            .all()
        )
    assert all(0 < float(d) <= 1.0 for d in delays), delays


async def test_last_attempt_goes_dead(clean_db: AsyncEngine) -> None:
    [job_id] = await seed_jobs(clean_db, 1, max_attempts=3)
    await _running(clean_db, [job_id], expires=-1.0, attempts=3)
    counts = await _reaper(clean_db).run_once()
    row = await job_row(clean_db, job_id)
    assert counts.dead == 1 and row["status"] == "dead" and row["finished_at"] is not None


async def test_batches_are_bounded_and_drain(clean_db: AsyncEngine) -> None:
    ids = await seed_jobs(clean_db, 25)
    await _running(clean_db, ids, expires=-1.0, attempts=1)
    reaper = _reaper(clean_db, batch_size=10)
    assert (await reaper.run_once()).total == 10
    assert await reaper.run_until_drained() == 15
    assert (await reaper.run_once()).total == 0
