"""The per-queue counters kept by triggers always equal a count of the table."""

from __future__ import annotations

import asyncio
import random
from dataclasses import replace

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.domain.types import LeaseUpdate, NewJob
from app.maintenance.counters import CounterFold, CounterFoldConfig
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

    fold = CounterFold(services=svc, config=CounterFoldConfig(batch_size=5))
    writers = asyncio.gather(*(producer(n) for n in range(4)), *(consumer(n) for n in range(4)))
    folds = 0
    while not writers.done():  # two folds at a time, racing the writers and each other
        await asyncio.gather(svc.upkeep.fold_counters(batch_size=7), fold.run_once())
        folds += 1
    await writers
    assert folds >= 1
    assert await _counted(clean_db) == await _actual(clean_db)


async def _rows(engine: AsyncEngine, table: str) -> int:
    async with engine.connect() as conn:
        return int((await conn.execute(text(f"SELECT count(*) FROM {table}"))).scalar_one())


async def test_a_fold_leaves_one_row_per_queue_and_state_with_the_same_sums(
    clean_db: AsyncEngine, svc: Services
) -> None:
    for n in range(12):  # each statement appends its own rows to the journals
        await svc.jobs.enqueue([NewJob(queue=QUEUES[n % 3], type="t")])
    claimed = await svc.jobs.claim(worker_id="w", queues=QUEUES, max_jobs=12, lease_seconds=30)
    for job in claimed[:6]:
        await svc.jobs.complete(
            worker_id="w", items=[LeaseUpdate(job_id=job.id, lease_id=str(job.lease_id))]
        )
    before = await _counted(clean_db)
    assert await _rows(clean_db, "queue_counts") > len(before)
    assert await _rows(clean_db, "queue_throughput") == 6

    fold = CounterFold(services=svc, config=CounterFoldConfig(batch_size=1000))
    journal = await _rows(clean_db, "queue_counts")
    assert await fold.run_once() == journal  # the larger journal, all of it
    assert await _counted(clean_db) == before == await _actual(clean_db)
    # succeeded and running in each queue; pending is gone where nothing is left pending
    assert await _rows(clean_db, "queue_counts") == len(before)
    assert await _rows(clean_db, "queue_throughput") == 3

    # A batch smaller than the journal folds part of it; the sums never change.
    await svc.jobs.enqueue([NewJob(queue="a", type="t")] * 3)
    await svc.jobs.enqueue([NewJob(queue="a", type="t")])
    assert await CounterFold(services=svc, config=CounterFoldConfig(batch_size=1)).run_once() == 1
    assert await _counted(clean_db) == await _actual(clean_db)
