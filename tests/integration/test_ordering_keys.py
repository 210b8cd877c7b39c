"""Ordering keys: a queue's jobs with one key run one at a time, in enqueue order (migration 0021).

Only a key's head (its oldest open job) is ever scheduled, pending or running; the others wait
outside the claim index. The tests drive the service and concurrent connections on a real
database and look at every job's state after each move.
"""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db import driver_dsn
from app.domain.states import JobStatus
from app.domain.types import LeaseUpdate, NewJob
from app.queue.services import Services

Q = "ordered"


async def _enqueue(svc: Services, key: str | None, **fields: Any) -> int:
    [(row, _)] = await svc.jobs.enqueue([NewJob(queue=Q, type="t", ordering_key=key, **fields)])
    return row.id


async def _states(engine: AsyncEngine, key: str) -> list[str]:
    async with engine.connect() as conn:
        rows = await conn.execute(
            text("SELECT status FROM jobs WHERE ordering_key = :k ORDER BY id"), {"k": key}
        )
        return [r.status for r in rows]


async def _claim_one(svc: Services) -> Any:
    [job] = await svc.jobs.claim(worker_id="w", queues=[Q], max_jobs=10, lease_seconds=30)
    return job


async def test_only_the_head_of_a_key_is_due_and_the_next_one_comes_when_it_ends(
    svc: Services, clean_db: AsyncEngine
) -> None:
    ids = [await _enqueue(svc, "k") for _ in range(3)]
    other = await _enqueue(svc, "other")
    plain = await _enqueue(svc, None)
    assert await _states(clean_db, "k") == ["pending", "waiting", "waiting"]

    jobs = await svc.jobs.claim(worker_id="w", queues=[Q], max_jobs=10, lease_seconds=30)
    assert sorted(j.id for j in jobs) == [ids[0], other, plain]  # other keys are never held
    head = next(j for j in jobs if j.id == ids[0])
    await svc.jobs.complete(
        worker_id="w", items=[LeaseUpdate(job_id=head.id, lease_id=str(head.lease_id))]
    )
    assert await _states(clean_db, "k") == ["succeeded", "pending", "waiting"]
    assert (await _claim_one(svc)).id == ids[1]


async def test_a_retrying_head_holds_the_key_and_a_dead_one_lets_the_next_run(
    svc: Services, clean_db: AsyncEngine
) -> None:
    first = await _enqueue(svc, "k", max_attempts=2)
    await _enqueue(svc, "k")
    job = await _claim_one(svc)
    item = LeaseUpdate(job_id=job.id, lease_id=str(job.lease_id), error="e", retry_after_seconds=0)
    await svc.jobs.fail(worker_id="w", items=[item])
    # Retried at once: pending again, and still the only open job of its key that is not waiting.
    assert await _states(clean_db, "k") == ["pending", "waiting"]
    job = await _claim_one(svc)
    assert job.id == first
    await svc.jobs.fail(
        worker_id="w", items=[LeaseUpdate(job_id=job.id, lease_id=str(job.lease_id), error="e")]
    )
    assert await _states(clean_db, "k") == ["dead", "pending"]


async def test_cancelling_a_waiting_job_does_not_start_the_one_after_it_early(
    svc: Services, clean_db: AsyncEngine
) -> None:
    ids = [await _enqueue(svc, "k") for _ in range(3)]
    await svc.ops.cancel(ids[1])
    assert await _states(clean_db, "k") == ["pending", "cancelled", "waiting"]
    await svc.ops.cancel(ids[0])
    assert await _states(clean_db, "k") == ["cancelled", "cancelled", "pending"]


async def test_a_finished_job_retried_by_an_operator_waits_its_turn(
    svc: Services, clean_db: AsyncEngine
) -> None:
    first = await _enqueue(svc, "k")
    job = await _claim_one(svc)
    await svc.jobs.fail(
        worker_id="w",
        items=[LeaseUpdate(job_id=job.id, lease_id=str(job.lease_id), retryable=False)],
    )
    second = await _enqueue(svc, "k")
    assert await _states(clean_db, "k") == ["dead", "pending"]
    retried = await svc.ops.retry(first)
    assert retried.status == JobStatus.WAITING
    job = await _claim_one(svc)
    assert job.id == second
    await svc.jobs.complete(
        worker_id="w", items=[LeaseUpdate(job_id=job.id, lease_id=str(job.lease_id))]
    )
    assert await _states(clean_db, "k") == ["pending", "succeeded"]


async def test_an_idempotent_replay_of_a_keyed_job_changes_no_turn(
    svc: Services, clean_db: AsyncEngine
) -> None:
    job = NewJob(queue=Q, type="t", ordering_key="k", idempotency_key="once", fingerprint="f")
    [(first, created)] = await svc.jobs.enqueue([job])
    [(again, created_again)] = await svc.jobs.enqueue([job])
    assert created and not created_again and again.id == first.id
    assert await _states(clean_db, "k") == ["pending"]
    claimed = await _claim_one(svc)
    await svc.jobs.complete(
        worker_id="w", items=[LeaseUpdate(job_id=claimed.id, lease_id=str(claimed.lease_id))]
    )
    assert (await _enqueue(svc, "k")) and await _states(clean_db, "k") == ["succeeded", "pending"]


async def test_concurrent_enqueues_and_finishes_of_one_key_never_leave_two_heads_or_none(
    svc: Services, clean_db: AsyncEngine
) -> None:
    """Producers on eight connections and a worker finishing heads, all at once."""
    total = 8 * 25
    finished: list[int] = []

    async def produce() -> None:
        for _ in range(25):
            await _enqueue(svc, "hot")

    async def work() -> None:
        while len(finished) < total:
            jobs = await svc.jobs.claim(worker_id="w", queues=[Q], max_jobs=5, lease_seconds=30)
            assert len(jobs) <= 1, [j.id for j in jobs]  # one head, whatever the interleaving
            for job in jobs:
                finished.append(job.id)
                await svc.jobs.complete(
                    worker_id="w", items=[LeaseUpdate(job_id=job.id, lease_id=str(job.lease_id))]
                )
            if not jobs:
                await asyncio.sleep(0.005)  # nothing due yet: the producers are still writing

    await asyncio.wait_for(asyncio.gather(*(produce() for _ in range(8)), work()), 60)
    assert finished == sorted(finished)  # enqueue (id) order
    assert await _states(clean_db, "hot") == ["succeeded"] * total


async def _insert(conn: Any, key: str) -> int:
    return int(
        await conn.fetchval(
            "INSERT INTO jobs (queue, type, ordering_key, max_attempts, lease_seconds) "
            "VALUES ($1, 't', $2, 3, 30) RETURNING id",
            Q,
            key,
        )
    )


async def test_a_finish_of_several_keys_never_waits_for_an_enqueue_holding_them(
    svc: Services, clean_db: AsyncEngine, database_url: str
) -> None:
    """The deadlock a finish taking key locks had: an enqueue holding key b, then wanting key a,
    while one statement finishes the heads of a and b. A finish takes no key lock now."""
    enqueue = await asyncpg.connect(driver_dsn(database_url))
    settle = await asyncpg.connect(driver_dsn(database_url))
    try:
        head_a, head_b = await _insert(enqueue, "a"), await _insert(enqueue, "b")
        await enqueue.execute(
            "UPDATE jobs SET status = 'running' WHERE id = ANY($1::bigint[])", [head_a, head_b]
        )
        tx = enqueue.transaction()
        await tx.start()
        later_b = await _insert(enqueue, "b")  # waits behind head_b: holds key b's row
        # Returns without waiting for the enqueue (a timeout here is the old deadlock's first half).
        await asyncio.wait_for(
            settle.execute(
                "UPDATE jobs SET status = 'succeeded', finished_at = now() "
                "WHERE id = ANY($1::bigint[])",
                [head_a, head_b],
            ),
            5,
        )
        later_a = await _insert(enqueue, "a")
        await tx.commit()
    finally:
        await enqueue.close()
        await settle.close()
    # later_a saw head_a finished: due at once. later_b was written while head_b still ran, and
    # head_b's finish could not see it: left waiting with nothing open, until caught up.
    assert await _states(clean_db, "a") == ["succeeded", "pending"]
    assert await _states(clean_db, "b") == ["succeeded", "waiting"]
    moved = await svc.workflows.unstick_ordering_keys(recent_seconds=60)
    assert moved == 1
    assert await _states(clean_db, "b") == ["succeeded", "pending"]
    assert (later_a, later_b) > (0, 0)
