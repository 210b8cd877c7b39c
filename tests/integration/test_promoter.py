"""The promoter's run_once on scheduled jobs either side of their run_at (exactly, via :now)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from app.maintenance.promoter import Promoter, PromoterConfig
from app.maintenance.runner import drain
from app.queue.services import Services
from tests.integration.helpers import db_now, job_row, seed_jobs, set_columns
from tests.integration.helpers import service as make_service


async def test_a_job_is_promoted_once_its_run_at_has_come(
    clean_db: AsyncEngine, driver_pool: Any
) -> None:
    announced: list[tuple[str, int]] = []
    service = make_service(
        clean_db, driver_pool, wake=lambda queue, count: announced.append((queue, count))
    )
    now = await db_now(clean_db)
    [edge] = await seed_jobs(clean_db, 1, queue="q", status="scheduled", run_at=now)
    [later] = await seed_jobs(
        clean_db, 1, queue="q", status="scheduled", run_at=now + timedelta(seconds=1)
    )
    promoter = Promoter(services=service, config=PromoterConfig())

    assert await promoter.run_once(now=now - timedelta(microseconds=1)) == 0
    assert await promoter.run_once(now=now) == 1
    assert announced == [("q", 1)]
    assert (await job_row(clean_db, edge))["status"] == "pending"
    assert (await job_row(clean_db, later))["status"] == "scheduled"


async def test_batches_are_bounded_and_drain(clean_db: AsyncEngine, svc: Services) -> None:
    ids = await seed_jobs(clean_db, 25, status="scheduled")
    await set_columns(clean_db, ids, run_at=await db_now(clean_db))
    promoter = Promoter(services=svc, config=PromoterConfig(batch_size=10))
    assert await promoter.run_once() == 10
    assert await drain(promoter) == 15
