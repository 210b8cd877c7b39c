"""The per-queue counters kept by triggers always equal a count of the table."""

from __future__ import annotations

import asyncio
import random
from dataclasses import replace

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.domain.types import LeaseUpdate, NewJob
from app.queue.services import Services

QUEUES = ["a", "b", "c"]


async def _counted(engine: AsyncEngine) -> dict[tuple[str, str], int]:
    async with engine.connect() as conn:
        rows = await conn.execute(
            text("SELECT queue, status, sum(jobs) FROM queue_counts GROUP BY 1, 2")
        )
        return {(q, s): int(n) for q, s, n in rows if n}


async def _actual(engine: AsyncEngine) -> dict[tuple[str, str], int]:
    async with engine.connect() as conn:
        rows = await conn.execute(text("SELECT queue, status, count(*) FROM jobs GROUP BY 1, 2"))
        return {(q, s): int(n) for q, s, n in rows}


async def test_counters_follow_every_kind_of_statement(
    clean_db: AsyncEngine, svc: Services
) -> None:
    rng = random.Random(7)
    jobs = [
        NewJob(queue=rng.choice(QUEUES), type="t", delay_seconds=rng.choice([None, 0, 3600]))
        for _ in range(60)
    ]
    await svc.jobs.enqueue(jobs)
    async with clean_db.begin() as conn:  # half of the delayed ones come due
        await conn.execute(
            text("UPDATE jobs SET run_at = now() WHERE status = 'scheduled' AND id % 2 = 0")
        )
    await svc.upkeep.promote(batch_size=100)
    claimed = await svc.jobs.claim(worker_id="w", queues=QUEUES, max_jobs=30, lease_seconds=30)
    items = [LeaseUpdate(job_id=j.id, lease_id=str(j.lease_id)) for j in claimed]
    await svc.jobs.complete(worker_id="w", items=items[:8])
    await svc.jobs.fail(worker_id="w", items=[replace(i, retryable=False) for i in items[8:12]])
    await svc.jobs.fail(worker_id="w", items=items[12:16])
    await svc.jobs.release(worker_id="w", items=items[16:20])
    await svc.ops.cancel(items[20].job_id)
    await svc.ops.retry(items[0].job_id)
    async with clean_db.begin() as conn:
        await conn.execute(
            text(
                "UPDATE jobs SET lease_expires_at = now() - interval '1 s' WHERE status = 'running'"
            )
        )
        await conn.execute(text("UPDATE jobs SET queue = 'moved' WHERE status = 'dead'"))
    await svc.upkeep.reap(batch_size=100)
    async with clean_db.begin() as conn:
        await conn.execute(
            text(
                "UPDATE jobs SET finished_at = now() - interval '100 days' WHERE status = 'succeeded'"
            )
        )
    await svc.upkeep.prune(
        batch_size=100, succeeded_seconds=60, cancelled_seconds=60, dead_seconds=60
    )
    assert await _counted(clean_db) == await _actual(clean_db)

    async with clean_db.begin() as conn:
        await conn.execute(text("TRUNCATE jobs"))
    assert await _counted(clean_db) == {}


async def test_counters_stay_exact_under_concurrent_writers(
    clean_db: AsyncEngine, svc: Services
) -> None:

    async def producer(n: int) -> None:
        for _ in range(10):
            await svc.jobs.enqueue([NewJob(queue=QUEUES[n % 3], type="t")] * 5)

    async def consumer(n: int) -> None:
        for _ in range(10):
            got = await svc.jobs.claim(
                worker_id=f"w{n}", queues=QUEUES, max_jobs=3, lease_seconds=30
            )
            items = [LeaseUpdate(job_id=j.id, lease_id=str(j.lease_id)) for j in got]
            if items:
                await svc.jobs.complete(worker_id=f"w{n}", items=items)

    await asyncio.gather(*(producer(n) for n in range(4)), *(consumer(n) for n in range(4)))
    assert await _counted(clean_db) == await _actual(clean_db)
    async with clean_db.connect() as conn:
        shards = (
            await conn.execute(text("SELECT count(DISTINCT shard) FROM queue_counts"))
        ).scalar_one()
    assert shards >= 1
