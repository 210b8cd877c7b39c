"""/readyz fails while a loop this instance runs keeps failing, and recovers with it (audit bug 6)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from asgi_lifespan import LifespanManager
from fastapi import FastAPI
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.ext.asyncio import AsyncEngine

from app.api.state import app_state
from app.main import create_app
from app.settings import Settings
from tests.polling import poll_until


@pytest.fixture
async def leader(database_url: str, clean_db: AsyncEngine) -> AsyncIterator[FastAPI]:
    app = create_app(
        Settings(
            database_url=database_url,
            reaper_interval_seconds=0.05,
            loop_stall_min_seconds=0.5,
        )
    )
    async with LifespanManager(app):
        yield app


@pytest.mark.parametrize("error", [PoolTimeout("pool exhausted"), RuntimeError("a bug")])
async def test_readyz_fails_while_the_reaper_fails_and_recovers_after(
    leader: FastAPI, error: Exception
) -> None:
    runtime = app_state(leader).running()
    await poll_until(lambda: runtime.runner.is_leader, within=10, what="leadership")
    repo = runtime.services.jobs.stores.maintenance
    real_reap = repo.job_reap

    async def broken(*args: Any, **kwargs: Any) -> Any:
        raise error

    transport = httpx.ASGITransport(app=leader)
    async with httpx.AsyncClient(transport=transport, base_url="http://jobq.test") as client:
        assert (await client.get("/readyz")).status_code == 200
        repo.job_reap = broken  # type: ignore[method-assign]

        async def not_ready() -> bool:
            r = await client.get("/readyz")
            return r.status_code == 503 and "reaper" in r.json()["detail"]

        await poll_until(not_ready, within=10, what="/readyz to fail")
        repo.job_reap = real_reap  # type: ignore[method-assign]

        async def ready() -> bool:
            return (await client.get("/readyz")).status_code == 200

        await poll_until(ready, within=40, what="/readyz to recover")
