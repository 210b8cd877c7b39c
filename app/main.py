"""``create_app(settings)``: the FastAPI app; its lifespan owns the engines and the maintenance loops."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import NullPool

from app.api import jobs, ops, workers
from app.api.limits import BodyLimit
from app.db import async_url, create_engine
from app.errors import install_error_handlers
from app.maintenance.reaper import Reaper, ReaperConfig
from app.maintenance.runner import MaintenanceRunner
from app.queue.repository import BackoffPolicy, Repository
from app.queue.service import JobService
from app.settings import Settings

API_DESCRIPTION = (
    "An HTTP job queue on PostgreSQL. Producers enqueue jobs; workers claim time-limited leases, "
    "heartbeat, and complete, fail or release them; every lease call is answered per item. "
    "Errors are RFC 9457 problem+json."
)


def _require_url(settings: Settings) -> str:
    if settings.database_url is None:
        raise RuntimeError("DATABASE_URL is not set; `jobq serve` starts an embedded server")
    return settings.database_url


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    """Builds engine, repository and service; runs maintenance while the app serves."""
    settings: Settings = app.state.settings
    url = _require_url(settings)
    engine = create_engine(
        url, pool_size=settings.db_pool_size, max_overflow=settings.db_max_overflow
    )
    repository = Repository(
        backoff=BackoffPolicy(
            base_seconds=settings.backoff_base_seconds,
            cap_seconds=settings.backoff_cap_seconds,
            errors_kept=settings.errors_kept,
            error_max_chars=settings.error_text_max_chars,
        )
    )
    app.state.service = JobService(engine=engine, repository=repository, settings=settings)
    runner: MaintenanceRunner | None = None
    lock_engine: AsyncEngine | None = None
    if settings.maintenance_enabled:
        lock_engine = create_async_engine(async_url(url), poolclass=NullPool)
        reaper = Reaper(
            engine=engine,
            repository=repository,
            config=ReaperConfig(
                interval_seconds=settings.reaper_interval_seconds,
                batch_size=settings.reaper_batch_size,
            ),
        )
        runner = MaintenanceRunner(lock_engine=lock_engine, repository=repository, loops=[reaper])
        runner.start()
    app.state.maintenance = runner
    try:
        yield
    finally:
        if runner is not None:
            await runner.stop()
        if lock_engine is not None:
            await lock_engine.dispose()
        await engine.dispose()


def create_app(settings: Settings) -> FastAPI:
    """Builds the app for these settings; nothing is connected until the lifespan starts."""
    app = FastAPI(
        title="jobq",
        version="0.1.0",
        description=API_DESCRIPTION,
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.max_json_depth = settings.max_json_depth
    install_error_handlers(app)
    app.add_middleware(BodyLimit, max_body_size=settings.max_body_bytes)
    app.include_router(jobs.router)
    app.include_router(workers.router)
    app.include_router(ops.router)
    return app
