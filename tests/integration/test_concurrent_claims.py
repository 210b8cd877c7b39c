"""Many claimers at once on committed rows: no job goes to two of them."""

from __future__ import annotations

import asyncio

from sqlalchemy.ext.asyncio import AsyncEngine

from app.queue.services import Services
from tests.integration.helpers import seed_jobs


async def test_parallel_claims_never_share_a_job(clean_db: AsyncEngine, svc: Services) -> None:
    ids = await seed_jobs(clean_db, 300)
    claimed: list[int] = []

    async def claimer(n: int) -> None:
        while True:
            rows = await svc.jobs.claim(
                worker_id=f"w{n}", queues=["default"], max_jobs=7, lease_seconds=30
            )
            if not rows:
                return
            claimed.extend(r.id for r in rows)

    await asyncio.gather(*(claimer(n) for n in range(5)))
    assert sorted(claimed) == sorted(ids)


async def test_claim_never_returns_more_than_max_jobs(clean_db: AsyncEngine, svc: Services) -> None:
    await seed_jobs(clean_db, 50, queue="a")
    await seed_jobs(clean_db, 50, queue="b")
    rows = await svc.jobs.claim(worker_id="w", queues=["a", "b"], max_jobs=13, lease_seconds=None)
    assert len(rows) == 13 and all(r.lease_seconds == 30 for r in rows)
