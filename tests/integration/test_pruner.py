"""The pruner's run_once on finished jobs either side of each state's retention (exactly, via :now)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.maintenance.pruner import Pruner, PrunerConfig
from app.maintenance.runner import drain
from app.queue.services import Services
from tests.integration.helpers import db_now, seed_jobs, set_columns

TICK = timedelta(microseconds=1)
HOUR = 3600.0
DAY = 86400.0


def _pruner(svc: Services, batch_size: int = 1000) -> Pruner:
    return Pruner(
        services=svc,
        config=PrunerConfig(
            batch_size=batch_size,
            succeeded_seconds=HOUR,
            cancelled_seconds=2 * HOUR,
            dead_seconds=DAY,
            throughput_seconds=HOUR,
        ),
    )


async def _remaining(engine: AsyncEngine) -> set[int]:
    async with engine.connect() as conn:
        return set((await conn.execute(text("SELECT id FROM jobs"))).scalars())


@pytest.mark.parametrize(
    ("status", "retention"), [("succeeded", HOUR), ("cancelled", 2 * HOUR), ("dead", DAY)]
)
async def test_each_state_is_kept_exactly_its_retention(
    clean_db: AsyncEngine, svc: Services, status: str, retention: float
) -> None:
    now = await db_now(clean_db)
    edge = await seed_jobs(clean_db, 1)
    pending = await seed_jobs(clean_db, 1)
    await set_columns(clean_db, edge, status=status, finished_at=now - timedelta(seconds=retention))
    # Another state's rows just past its own (shorter or longer) retention stay out of this.
    await set_columns(clean_db, pending, finished_at=now - timedelta(days=365))
    pruner = _pruner(svc)

    assert (await pruner.run_once(now=now)).jobs == 0  # retention ends exactly now: kept
    assert (await pruner.run_once(now=now + TICK)).jobs == 1
    assert await _remaining(clean_db) == set(pending)


async def test_batches_are_bounded_and_drain(clean_db: AsyncEngine, svc: Services) -> None:
    ids = await seed_jobs(clean_db, 25)
    await set_columns(
        clean_db, ids, status="succeeded", finished_at=await db_now(clean_db) - timedelta(days=1)
    )
    pruner = _pruner(svc, batch_size=10)
    assert (await pruner.run_once()).jobs == 10
    assert await drain(pruner) == 15
    assert await _remaining(clean_db) == set()


async def test_throughput_minutes_are_kept_for_their_retention(
    clean_db: AsyncEngine, svc: Services
) -> None:
    now = await db_now(clean_db)
    async with clean_db.begin() as conn:
        await conn.execute(
            text(
                "INSERT INTO queue_throughput (queue, minute, outcome, shard, jobs) "
                "VALUES ('q', :edge, 'succeeded', 0, 1), ('q', :young, 'succeeded', 0, 1)"
            ),
            {"edge": now - timedelta(seconds=HOUR), "young": now},
        )
    pruner = _pruner(svc)
    assert (await pruner.run_once(now=now)).throughput_rows == 0
    assert (await pruner.run_once(now=now + TICK)).throughput_rows == 1


def test_config_is_validated() -> None:
    with pytest.raises(ValueError, match="batch_size"):
        PrunerConfig(batch_size=0)
    with pytest.raises(ValueError, match="dead_seconds"):
        PrunerConfig(dead_seconds=-1)
