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

    fold = CounterFold(services=svc, config=CounterFoldConfig(lock_timeout_ms=50))
    writers = asyncio.gather(*(producer(n) for n in range(4)), *(consumer(n) for n in range(4)))
    folds = 0
    while not writers.done():  # two folds at a time, racing the writers and each other
        await asyncio.gather(svc.upkeep.fold_counters(lock_timeout_ms=20), fold.run_once())
        folds += 1
    await writers
    assert folds >= 1
    assert await _counted(clean_db) == await _actual(clean_db)


async def _rows(engine: AsyncEngine, table: str) -> int:
    async with engine.connect() as conn:
        return int((await conn.execute(text(f"SELECT count(*) FROM {table}"))).scalar_one())


async def _slot_rows(engine: AsyncEngine) -> dict[str, int]:
    """Rows per partition of the two journals, and which journal slot is current."""
    async with engine.connect() as conn:
        rows = await conn.execute(
            text(
                "SELECT 'counts', slot, count(*) FROM queue_counts GROUP BY slot "
                "UNION ALL SELECT 'throughput', slot, count(*) FROM queue_throughput GROUP BY slot"
            )
        )
        found = {f"{table}:{slot}": int(n) for table, slot, n in rows}
        found["current"] = int(
            (await conn.execute(text("SELECT slot FROM counter_journal_slot"))).scalar_one()
        )
        return found


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

    fold = CounterFold(services=svc, config=CounterFoldConfig())
    journal = await _rows(clean_db, "queue_counts")
    assert await fold.run_once() == journal  # the larger journal, all of it
    assert await _counted(clean_db) == before == await _actual(clean_db)
    # succeeded and running in each queue; pending is gone where nothing is left pending
    assert await _rows(clean_db, "queue_counts_totals") == len(before)
    assert await _rows(clean_db, "queue_counts") == len(before)
    assert await _rows(clean_db, "queue_throughput_totals") == 3

    # What comes after goes to the slot the fold turned to; the next fold adds it to the sums.
    await svc.jobs.enqueue([NewJob(queue="a", type="t")] * 3)
    slots = await _slot_rows(clean_db)
    assert slots[f"counts:{slots['current']}"] == 1
    assert await fold.run_once() == 1
    assert await _counted(clean_db) == await _actual(clean_db)
    assert await fold.run_once() == 0  # nothing appended since: an empty slot folds to nothing


async def test_a_fold_waits_for_the_transactions_appending_to_its_slot(
    clean_db: AsyncEngine, svc: Services
) -> None:
    await svc.jobs.enqueue([NewJob(queue="a", type="t")] * 2)
    async with clean_db.connect() as held:
        # A transaction that appended to the current slot and has not committed yet.
        await held.begin()
        await held.execute(
            text(
                "INSERT INTO jobs (queue, type, status, max_attempts, lease_seconds) "
                "VALUES ('a', 't', 'pending', 1, 30), ('b', 't', 'pending', 1, 30)"
            )
        )
        # The fold turns away from that slot, then cannot lock it: it gives up and says so.
        assert await svc.upkeep.fold_counters(lock_timeout_ms=50) is None
        assert await _counted(clean_db) == {("a", "pending"): 2}
        # The next pass turns back to that slot and folds the other (empty) one.
        assert await svc.upkeep.fold_counters(lock_timeout_ms=50) == 0
        # The pass after waits, and folds once the appender commits.
        waiting = asyncio.create_task(svc.upkeep.fold_counters(lock_timeout_ms=30_000))
        async with clean_db.connect() as probe:
            deadline = asyncio.get_running_loop().time() + 10
            while True:  # until the fold's lock request queues behind the open transaction
                blocked = await probe.scalar(
                    text(
                        "SELECT count(*) FROM pg_locks WHERE NOT granted "
                        "AND relation::regclass::text LIKE 'queue_counts_slot%'"
                    )
                )
                if blocked or asyncio.get_running_loop().time() > deadline:
                    break
                await probe.commit()
        assert blocked == 1
        assert not waiting.done()
        await held.commit()
    assert await waiting == 3  # the first enqueue's row and the open transaction's two
    assert await _counted(clean_db) == {("a", "pending"): 3, ("b", "pending"): 1}
    assert await _counted(clean_db) == await _actual(clean_db)
    slots = await _slot_rows(clean_db)
    assert set(slots) == {"counts:0", "current"}


async def _stat_totals(engine: AsyncEngine) -> tuple[int, int]:
    """Inserts and deletes counted for the journal slots (not the sums) of both journals."""
    async with engine.connect() as conn:
        await conn.execute(text("SELECT pg_stat_clear_snapshot()"))
        row = (
            await conn.execute(
                text(
                    "SELECT COALESCE(sum(n_tup_ins), 0), COALESCE(sum(n_tup_del), 0) "
                    "FROM pg_stat_user_tables "
                    "WHERE relname IN ('queue_counts_slot1', 'queue_counts_slot2', "
                    "'queue_throughput_slot1', 'queue_throughput_slot2')"
                )
            )
        ).one()
        return int(row[0]), int(row[1])


async def test_a_drain_and_a_fold_leave_the_journal_slots_empty_without_a_delete(
    clean_db: AsyncEngine, svc: Services
) -> None:
    inserted_before, deleted_before = await _stat_totals(clean_db)
    for n in range(6):
        await svc.jobs.enqueue([NewJob(queue=QUEUES[n % 3], type="t")] * 5)
    while claimed := await svc.jobs.claim(
        worker_id="w", queues=QUEUES, max_jobs=4, lease_seconds=30
    ):
        items = [LeaseUpdate(job_id=j.id, lease_id=str(j.lease_id)) for j in claimed]
        await svc.jobs.complete(worker_id="w", items=items)
    appended = await _rows(clean_db, "queue_counts") + await _rows(clean_db, "queue_throughput")
    fold = CounterFold(services=svc, config=CounterFoldConfig())
    assert await fold.run_once() > 0
    slots = await _slot_rows(clean_db)
    assert slots.get(f"counts:{3 - slots['current']}", 0) == 0
    assert slots.get(f"throughput:{3 - slots['current']}", 0) == 0
    assert await _counted(clean_db) == {(q, "succeeded"): 10 for q in QUEUES}
    # The statistics arrive when each backend flushes them: wait until the inserts show.
    deadline = asyncio.get_running_loop().time() + 30
    while True:
        inserted, deleted = await _stat_totals(clean_db)
        if inserted - inserted_before >= appended or asyncio.get_running_loop().time() > deadline:
            break
        await asyncio.sleep(0.2)
    assert inserted - inserted_before >= appended
    assert deleted == deleted_before


# The previous release's fold (app/store/sql/queues.sql before migration 0028), which instances
# not yet replaced keep running during a rolling deploy.
PREVIOUS_COUNTS_FOLD = """
WITH folded AS (
    DELETE FROM queue_counts c
    WHERE c.ctid = ANY (ARRAY(SELECT ctid FROM queue_counts LIMIT :batch_size))
    RETURNING c.queue, c.status, c.jobs
),
summed AS (
    INSERT INTO queue_counts (queue, status, jobs)
    SELECT queue, status, sum(jobs) FROM folded GROUP BY queue, status HAVING sum(jobs) <> 0
)
SELECT count(*) AS folded FROM folded
"""
PREVIOUS_THROUGHPUT_FOLD = """
WITH folded AS (
    DELETE FROM queue_throughput t
    WHERE t.ctid = ANY (ARRAY(SELECT ctid FROM queue_throughput LIMIT :batch_size))
    RETURNING t.queue, t.minute, t.outcome, t.jobs
),
summed AS (
    INSERT INTO queue_throughput (queue, minute, outcome, jobs)
    SELECT queue, minute, outcome, sum(jobs) FROM folded GROUP BY queue, minute, outcome
)
SELECT count(*) AS folded FROM folded
"""


async def _outcomes(engine: AsyncEngine) -> int:
    async with engine.connect() as conn:
        return int(
            await conn.scalar(text("SELECT COALESCE(sum(jobs), 0) FROM queue_throughput")) or 0
        )


async def test_the_previous_release_folds_beside_this_one_and_the_sums_stay_exact(
    clean_db: AsyncEngine, svc: Services
) -> None:
    async def previous_fold() -> None:
        async with clean_db.begin() as conn:
            await conn.execute(text(PREVIOUS_COUNTS_FOLD), {"batch_size": 50_000})
            await conn.execute(text(PREVIOUS_THROUGHPUT_FOLD), {"batch_size": 50_000})
            # Its deletes show in pg_stat_user_tables at once, not during a later test that
            # counts them (test_a_drain_and_a_fold_leave_the_journal_slots_empty_...).
            await conn.execute(text("SELECT pg_stat_force_next_flush()"))

    async def consumer(n: int) -> int:
        done = 0
        for _ in range(10):
            got = await svc.jobs.claim(
                worker_id=f"w{n}", queues=QUEUES, max_jobs=3, lease_seconds=30
            )
            items = [LeaseUpdate(job_id=j.id, lease_id=str(j.lease_id)) for j in got]
            if items:
                await svc.jobs.complete(worker_id=f"w{n}", items=items)
                done += len(items)
        return done

    for n in range(6):
        await svc.jobs.enqueue([NewJob(queue=QUEUES[n % 3], type="t")] * 10)
    writers = asyncio.gather(*(consumer(n) for n in range(4)))
    folds = 0
    while not writers.done():  # both releases' folds at once, racing the writers
        await asyncio.gather(svc.upkeep.fold_counters(lock_timeout_ms=50), previous_fold())
        folds += 1
    completed = sum(await writers)
    await previous_fold()
    await svc.upkeep.fold_counters(lock_timeout_ms=1000)
    assert folds >= 1 and completed > 0
    assert await _counted(clean_db) == await _actual(clean_db)
    assert await _outcomes(clean_db) == completed
    # The sums stay one row per key whichever release folded last.
    assert await _rows(clean_db, "queue_counts_totals") == len(await _actual(clean_db))
