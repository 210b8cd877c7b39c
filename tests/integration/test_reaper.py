"""The reaper's run_once on leases either side of their expiry (exactly at it, through :now)."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.maintenance.reaper import Reaper, ReaperConfig
from app.maintenance.runner import drain
from app.queue.services import Services
from tests.integration.helpers import db_now, job_row, seed_jobs, set_columns

TICK = timedelta(microseconds=1)


def _reaper(svc: Services, batch_size: int = 500) -> Reaper:
    return Reaper(services=svc, config=ReaperConfig(interval_seconds=1, batch_size=batch_size))


async def _running(engine: AsyncEngine, count: int, **columns: object) -> list[int]:
    ids = await seed_jobs(engine, count)
    now = await db_now(engine)
    values = {"attempts": 1, "lease_expires_at": now, "started_at": now, **columns}
    await set_columns(engine, ids, status="running", worker_id="w", **values)
    async with engine.begin() as conn:
        await conn.execute(
            text("UPDATE jobs SET lease_id = gen_random_uuid() WHERE id = ANY(:ids)"), {"ids": ids}
        )
    return ids


async def test_a_lease_is_reaped_only_once_its_expiry_has_passed(
    clean_db: AsyncEngine, svc: Services
) -> None:
    now = await db_now(clean_db)
    [edge] = await _running(clean_db, 1, lease_expires_at=now)
    [later] = await _running(clean_db, 1, lease_expires_at=now + timedelta(seconds=5))
    reaper = _reaper(svc)

    assert (await reaper.run_once(now=now)).total == 0  # expires at now: still held
    counts = await reaper.run_once(now=now + TICK)
    assert (counts.retried, counts.dead, counts.queues) == (1, 0, frozenset({"default"}))

    row = await job_row(clean_db, edge)
    assert row["status"] == "scheduled" and row["lease_ended_by"] == "expire"
    assert row["lease_expires_at"] is None and row["lease_id"] is not None  # kept for verdicts
    # Full-jitter backoff after attempt 1: (0, 1 s] after the reaper's clock.
    assert now + TICK < row["run_at"] <= now + TICK + timedelta(seconds=1)
    assert row["errors"][-1]["kind"] == "lease_expired" and row["last_error"] == "lease expired"
    assert (await job_row(clean_db, later))["status"] == "running"


async def test_the_last_attempt_goes_dead(clean_db: AsyncEngine, svc: Services) -> None:
    now = await db_now(clean_db)
    [job] = await _running(clean_db, 1, attempts=10, max_attempts=10, lease_expires_at=now)
    counts = await _reaper(svc).run_once(now=now + TICK)
    assert (counts.retried, counts.dead) == (0, 1)
    row = await job_row(clean_db, job)
    assert row["status"] == "dead" and row["finished_at"] == now + TICK


async def test_an_attempt_past_its_timeout_is_reaped_as_timed_out(
    clean_db: AsyncEngine, svc: Services
) -> None:
    now = await db_now(clean_db)
    started = now - timedelta(seconds=10)
    [job] = await _running(
        clean_db, 1, started_at=started, timeout_seconds=10, lease_expires_at=now
    )
    await _reaper(svc).run_once(now=now + TICK)
    row = await job_row(clean_db, job)
    assert row["lease_ended_by"] == "timeout" and row["errors"][-1]["kind"] == "timed_out"


async def test_batches_are_bounded_and_drain(clean_db: AsyncEngine, svc: Services) -> None:
    await _running(clean_db, 25)
    reaper = _reaper(svc, batch_size=10)
    later = await db_now(clean_db) + timedelta(seconds=1)
    assert (await reaper.run_once(now=later)).total == 10
    assert await drain(reaper) == 15
    assert (await reaper.run_once()).total == 0
