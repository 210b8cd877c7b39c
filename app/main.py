"""``create_app(settings)``: the FastAPI app; its lifespan owns engines, wake-ups and maintenance."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

from app.api import jobs, ops, workers
from app.api.limits import BodyLimit
from app.db import async_url, create_engine
from app.errors import install_error_handlers
from app.maintenance.promoter import Promoter, PromoterConfig
from app.maintenance.pruner import Pruner, PrunerConfig
from app.maintenance.reaper import Reaper, ReaperConfig
from app.maintenance.runner import MaintenanceRunner
from app.queue.repository import BackoffPolicy, Repository
from app.queue.service import JobService
from app.settings import Settings
from app.wakeup.backstop import Backstop
from app.wakeup.control import ControlChannel
from app.wakeup.hub import WaiterHub

API_DESCRIPTION = (
    "An HTTP job queue on PostgreSQL. Producers enqueue jobs; workers claim time-limited leases, "
    "heartbeat, and complete, fail or release them; every lease call is answered per item. "
    "Errors are RFC 9457 problem+json."
)

CONTROL_CONNECT_WAIT_SECONDS = 5.0


def _require_url(settings: Settings) -> str:
    if settings.database_url is None:
        raise RuntimeError("DATABASE_URL is not set; `jobq serve` starts an embedded server")
    return settings.database_url


def _repository(settings: Settings) -> Repository:
    return Repository(
        backoff=BackoffPolicy(
            base_seconds=settings.backoff_base_seconds,
            cap_seconds=settings.backoff_cap_seconds,
            errors_kept=settings.errors_kept,
            error_max_chars=settings.error_text_max_chars,
        )
    )


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    """Builds the pool, the control connection, the service and the maintenance loops; tears down."""
    settings: Settings = app.state.settings
    url = _require_url(settings)
    engine = create_engine(
        url, pool_size=settings.db_pool_size, max_overflow=settings.db_max_overflow
    )
    # The control connection lives outside the pool: parked claims never hold a pooled one.
    control_engine = create_async_engine(
        async_url(url),
        poolclass=NullPool,
        connect_args={"server_settings": {"application_name": "jobq-control"}},
    )
    # Reads and single statements need no BEGIN / COMMIT round trips.
    autocommit = engine.execution_options(isolation_level="AUTOCOMMIT")
    repository = _repository(settings)
    hub = WaiterHub()
    control = ControlChannel(
        engine=control_engine,
        repository=repository,
        hub=hub,
        coalesce_window=settings.notify_coalesce_seconds,
    )
    announce = control.announce if settings.wakeup_announce else _announce_nothing
    app.state.hub = hub
    app.state.control = control
    app.state.service = JobService(
        engine=engine, repository=repository, settings=settings, hub=hub, announce=announce
    )
    loop = asyncio.get_running_loop()
    # Called from the signal handler: parked claims answer at once instead of holding the exit.
    app.state.begin_shutdown = lambda: loop.call_soon_threadsafe(hub.close)

    backstop = Backstop(
        engine=autocommit,
        repository=repository,
        hub=hub,
        interval_seconds=settings.longpoll_backstop_seconds,
    )
    control.start()
    backstop.start()
    await control.wait_connected(CONTROL_CONNECT_WAIT_SECONDS)
    runner: MaintenanceRunner | None = None
    if settings.maintenance_enabled:
        runner = MaintenanceRunner(
            lead=control.lead,
            loops=[
                Reaper(
                    engine=engine,
                    repository=repository,
                    config=ReaperConfig(
                        interval_seconds=settings.reaper_interval_seconds,
                        batch_size=settings.reaper_batch_size,
                    ),
                ),
                Promoter(
                    engine=autocommit,
                    repository=repository,
                    announce=announce,
                    config=PromoterConfig(interval_seconds=settings.promoter_interval_seconds),
                ),
                Pruner(
                    engine=engine,
                    repository=repository,
                    config=PrunerConfig(
                        interval_seconds=settings.pruner_interval_seconds,
                        succeeded_seconds=settings.retention_succeeded_seconds,
                        cancelled_seconds=settings.retention_cancelled_seconds,
                        dead_seconds=settings.retention_dead_seconds,
                    ),
                ),
            ],
        )
        runner.start()
    app.state.maintenance = runner
    try:
        yield
    finally:
        hub.close()
        await backstop.stop()
        if runner is not None:
            await runner.stop()
        await control.stop()
        await control_engine.dispose()
        await engine.dispose()


def _announce_nothing(queue: str, count: int) -> None:
    """Wake-ups switched off (``JOBQ_WAKEUP_ANNOUNCE=false``): waiters rely on the backstop."""


def create_app(settings: Settings) -> FastAPI:
    """Builds the app for these settings; nothing is connected until the lifespan starts."""
    app = FastAPI(title="jobq", version="0.1.0", description=API_DESCRIPTION, lifespan=lifespan)
    app.state.settings = settings
    app.state.max_json_depth = settings.max_json_depth
    install_error_handlers(app)
    app.add_middleware(BodyLimit, max_body_size=settings.max_body_bytes)
    app.include_router(jobs.router)
    app.include_router(workers.router)
    app.include_router(ops.router)
    return app
