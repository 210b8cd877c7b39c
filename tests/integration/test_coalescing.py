"""Coalesced requests on a real database: shared statements, per-item ownership, per-claim leases."""

from __future__ import annotations

import asyncio
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from app.domain.types import LeaseUpdate, NewJob
from app.queue.jobs import CoalescingPolicy
from app.queue.services import Services
from tests.integration.helpers import job_row, seed_jobs, service


def _coalescing(engine: AsyncEngine, pool: Any) -> Services:
    return service(engine, pool, coalescing=CoalescingPolicy(max_in_flight=1, max_items=1000))


async def test_concurrent_claims_share_statements_and_each_get_their_own_leases(
    clean_db: AsyncEngine, driver_pool: Any
) -> None:
    svc = _coalescing(clean_db, driver_pool)
    ids = await seed_jobs(clean_db, 60)
    answers = await asyncio.gather(
        *(
            svc.jobs.claim(worker_id=f"w{n}", queues=["default"], max_jobs=3, lease_seconds=10 + n)
            for n in range(20)
        )
    )
    got = [row.id for rows in answers for row in rows]
    assert sorted(got) == sorted(ids)  # every job once, to exactly one claim
    for n, rows in enumerate(answers):
        assert len(rows) == 3
        for row in rows:
            stored = await job_row(clean_db, row.id)
            assert stored["worker_id"] == f"w{n}" and stored["lease_granted_seconds"] == 10 + n
            assert row.lease_id == stored["lease_id"]


async def test_coalesced_completes_check_ownership_item_by_item(
    clean_db: AsyncEngine, driver_pool: Any
) -> None:
    svc = _coalescing(clean_db, driver_pool)
    await seed_jobs(clean_db, 40)
    claims = await asyncio.gather(
        *(
            svc.jobs.claim(worker_id=f"w{n}", queues=["default"], max_jobs=2, lease_seconds=30)
            for n in range(20)
        )
    )

    async def complete(n: int, rows: list[Any]) -> Any:
        # Odd workers also name a lease of their neighbour's: that item alone must be refused.
        items = [LeaseUpdate(job_id=r.id, lease_id=str(r.lease_id)) for r in rows]
        if n % 2:
            other = claims[n - 1][0]
            items.append(LeaseUpdate(job_id=other.id, lease_id=str(other.lease_id)))
        return await svc.jobs.complete(worker_id=f"w{n}", items=items)

    before = svc.unit.statements["lease_complete"]
    results = await asyncio.gather(*(complete(n, rows) for n, rows in enumerate(claims)))
    used = svc.unit.statements["lease_complete"] - before
    for n, outcomes in enumerate(results):
        assert [o.ok for o in outcomes[:2]] == [True, True]
        if n % 2:
            # Its neighbour completed that job in the same round (or will): never by this worker.
            assert outcomes[2].status is None or outcomes[2].job_id == claims[n - 1][0]["id"]
            assert not outcomes[2].ok
    assert used < len(claims), used  # requests shared statements


async def test_coalesced_single_enqueues_keep_their_own_idempotency(
    clean_db: AsyncEngine, driver_pool: Any
) -> None:
    svc = _coalescing(clean_db, driver_pool)
    first = await svc.jobs.enqueue(
        [NewJob(queue="q", type="t", idempotency_key="k", fingerprint="a")]
    )

    async def one(n: int) -> Any:
        key = "k" if n == 3 else None
        fingerprint = "b" if n == 3 else None  # key reused with another request: 422 alone
        return await svc.jobs.enqueue(
            [NewJob(queue="q", type="t", payload=n, idempotency_key=key, fingerprint=fingerprint)],
        )

    outcomes = await asyncio.gather(*(one(n) for n in range(10)), return_exceptions=True)
    failures = [o for o in outcomes if isinstance(o, Exception)]
    assert len(failures) == 1 and type(failures[0]).__name__ == "IdempotencyKeyReused"
    created = [o[0] for o in outcomes if not isinstance(o, Exception)]
    assert all(made for _, made in created) and len(created) == 9
    assert first[0][0].id not in {row.id for row, _ in created}
