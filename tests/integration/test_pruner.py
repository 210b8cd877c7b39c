"""The pruner's run_once on finished jobs either side of their retention, in bounded batches."""

from __future__ import annotations

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.maintenance.pruner import Pruner, PrunerConfig
from tests.integration.helpers import repository, seed_jobs


async def _finish(engine: AsyncEngine, ids: list[int], *, status: str, age: float) -> None:
    async with engine.begin() as conn:
        await conn.execute(
            text(
                "UPDATE jobs SET status = :status, "
                "finished_at = now() - make_interval(secs => :age) WHERE id = ANY(:ids)"
            ),
            {"ids": ids, "status": status, "age": age},
        )


def _pruner(engine: AsyncEngine, batch_size: int = 1000) -> Pruner:
    return Pruner(
        engine=engine,
        repository=repository(),
        config=PrunerConfig(
            batch_size=batch_size,
            succeeded_seconds=3600,
            cancelled_seconds=3600,
            dead_seconds=86400,
        ),
    )


async def _remaining(engine: AsyncEngine) -> set[int]:
    async with engine.connect() as conn:
        return set((await conn.execute(text("SELECT id FROM jobs"))).scalars())


async def test_prunes_only_finished_jobs_past_their_retention(clean_db: AsyncEngine) -> None:
    old_ok = await seed_jobs(clean_db, 3)
    young_ok = await seed_jobs(clean_db, 2)
    old_dead_within = await seed_jobs(clean_db, 2)  # dead jobs are kept longer
    old_dead = await seed_jobs(clean_db, 1)
    pending = await seed_jobs(clean_db, 2)
    await _finish(clean_db, old_ok, status="succeeded", age=7200)
    await _finish(clean_db, young_ok, status="succeeded", age=60)
    await _finish(clean_db, old_dead_within, status="dead", age=7200)
    await _finish(clean_db, old_dead, status="dead", age=90000)

    assert await _pruner(clean_db).run_once() == 4
    assert await _remaining(clean_db) == {*young_ok, *old_dead_within, *pending}


async def test_batches_are_bounded(clean_db: AsyncEngine) -> None:
    ids = await seed_jobs(clean_db, 25)
    await _finish(clean_db, ids, status="cancelled", age=7200)
    pruner = _pruner(clean_db, batch_size=10)
    assert await pruner.run_once() == 10
    assert await pruner.run_until_drained() == 15
    assert await _remaining(clean_db) == set()


def test_config_is_validated() -> None:
    with pytest.raises(ValueError):
        PrunerConfig(batch_size=0)
    with pytest.raises(ValueError):
        PrunerConfig(dead_seconds=-1)
