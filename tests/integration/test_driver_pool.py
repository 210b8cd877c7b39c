"""The hot path's driver pool: a statement cancelled mid-flight never poisons a pooled connection."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.domain.types import LeaseUpdate
from app.queue.services import Services
from tests.integration.helpers import seed_jobs
from tests.locks import someone_waits_on_a_lock
from tests.polling import poll_until


async def test_a_cancelled_statement_leaves_the_pool_healthy(
    clean_db: AsyncEngine, svc: Services, driver_pool: Any
) -> None:
    [job_id] = await seed_jobs(clean_db, 1)
    [claimed] = await svc.jobs.claim(
        worker_id="w", queues=["default"], max_jobs=1, lease_seconds=30
    )
    item = LeaseUpdate(job_id=job_id, lease_id=str(claimed.lease_id))
    async with clean_db.connect() as holder:
        transaction = await holder.begin()
        await holder.execute(text("SELECT 1 FROM jobs WHERE id = :id FOR UPDATE"), {"id": job_id})
        blocked = asyncio.ensure_future(svc.jobs.complete(worker_id="w", items=[item]))
        await poll_until(lambda: someone_waits_on_a_lock(clean_db), what="the complete to wait")
        blocked.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await blocked
        await transaction.rollback()
    # Every connection of the pool serves again, many times over.
    answers = await asyncio.gather(
        *(svc.jobs.get(job_id) for _ in range(4 * driver_pool.get_max_size()))
    )
    assert {a.id for a in answers} == {job_id}
    [done] = await svc.jobs.complete(worker_id="w", items=[item])
    assert done.ok and done.status == "succeeded"
