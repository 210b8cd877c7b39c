"""``create_app(settings)``: the FastAPI app; its lifespan owns engines, wake-ups and maintenance."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path

from fastapi import FastAPI
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine

from app.api import (
    flow_limits,
    history,
    jobs,
    maintenance,
    metrics,
    ops,
    schedules,
    webhooks,
    workers,
    workflows,
)
from app.api.schedules_file import load_schedules_file
from app.api.schemas import CONCURRENCY_KEY_MAX_CHARS
from app.api.state import AppState, Runtime, app_state
from app.api.webhook_models import address_policy
from app.auth import store as key_store
from app.auth.keyring import KeyRing
from app.auth.limiter import FailureLimiter
from app.dashboard import docs as api_docs
from app.dashboard import router as dashboard
from app.db import create_control_engine, create_driver_pool, create_engine, jit_compiles
from app.domain.cron import ScheduleSpec
from app.domain.types import EnqueueLimits, JobDefaults
from app.errors import DatabaseUnavailable, brief, install_error_handlers
from app.http.body_limit import BodyLimit
from app.http.fastpath import JobqAPI
from app.logs import AppLogs
from app.maintenance.counters import CounterFold, CounterFoldConfig
from app.maintenance.gauges import QueueGauges
from app.maintenance.promoter import Promoter, PromoterConfig
from app.maintenance.pruner import Pruner, PrunerConfig
from app.maintenance.reaper import Reaper, ReaperConfig
from app.maintenance.runner import Loop, LoopRunner
from app.maintenance.scheduler import Scheduler, SchedulerConfig
from app.maintenance.sightings import WorkerSightings
from app.maintenance.statistics import JobStatistics
from app.maintenance.webhooks import WebhookConfig, WebhookDeliveries
from app.queue.jobs import CoalescingPolicy
from app.queue.linked import ParentResultBounds
from app.queue.results import CHANNEL as FINISHED_CHANNEL
from app.queue.results import ResultHub
from app.queue.services import Services, build_services
from app.queue.waiters import WaiterHub
from app.settings import Settings
from app.store import stores_for
from app.store.unit import UnitOfWork
from app.wakeup.backstop import Backstop
from app.wakeup.control import ControlChannel, ignoring_payload
from app.wakeup.result_backstop import ResultBackstop

API_DESCRIPTION = (
    "An HTTP job queue on PostgreSQL. Producers enqueue jobs; workers claim time-limited leases, "
    "heartbeat, and complete, fail or release them; every lease call is answered per item. "
    "Errors are RFC 9457 problem+json."
)

CONTROL_CONNECT_WAIT_SECONDS = 5.0

logger = logging.getLogger("jobq.auth")
producers_logger = logging.getLogger("jobq.producers")
schedule_logger = logging.getLogger("jobq.schedules")
db_logger = logging.getLogger("jobq.db")


def _require_url(settings: Settings) -> str:
    if settings.database_url is None:
        raise RuntimeError("DATABASE_URL is not set; `jobq serve` starts an embedded server")
    return settings.database_url


def _loops(settings: Settings, services: Services, hub: WaiterHub) -> list[Loop]:
    """Every background loop of an instance: five on every instance, the webhook deliveries on
    every instance taking part in maintenance, five on the leader only."""
    loops: list[Loop] = [
        Promoter(
            services=services,
            config=PromoterConfig(
                interval_seconds=settings.promoter_interval_seconds,
                batch_size=settings.promoter_batch_size,
            ),
        ),
        Backstop(services=services, hub=hub, interval_seconds=settings.longpoll_backstop_seconds),
        ResultBackstop(
            services=services,
            interval_seconds=settings.longpoll_backstop_seconds,
        ),
        QueueGauges(services=services, interval_seconds=settings.metrics_refresh_seconds),
        WorkerSightings(services=services),
    ]
    if settings.maintenance_enabled:
        secret = settings.webhook_secret
        loops += [
            WebhookDeliveries(
                services=services,
                config=WebhookConfig(
                    interval_seconds=settings.webhook_interval_seconds,
                    batch_size=settings.webhook_batch_size,
                    timeout_seconds=settings.webhook_timeout_seconds,
                    in_flight_seconds=settings.webhook_in_flight_seconds,
                    backoff_base_seconds=settings.webhook_backoff_base_seconds,
                    backoff_cap_seconds=settings.webhook_backoff_cap_seconds,
                    give_up_seconds=settings.webhook_give_up_seconds,
                    secret_grace_seconds=settings.webhook_secret_grace_seconds,
                    default_secret=secret.get_secret_value() if secret is not None else None,
                    policy=address_policy(settings),
                ),
            ),
            Reaper(
                services=services,
                config=ReaperConfig(
                    interval_seconds=settings.reaper_interval_seconds,
                    batch_size=settings.reaper_batch_size,
                ),
            ),
            Pruner(
                services=services,
                config=PrunerConfig(
                    interval_seconds=settings.pruner_interval_seconds,
                    batch_size=settings.pruner_batch_size,
                    succeeded_seconds=settings.retention_succeeded_seconds,
                    cancelled_seconds=settings.retention_cancelled_seconds,
                    dead_seconds=settings.retention_dead_seconds,
                    throughput_seconds=settings.retention_throughput_seconds,
                    webhook_seconds=settings.webhook_retention_seconds,
                ),
            ),
            CounterFold(services=services, config=CounterFoldConfig()),
            JobStatistics(services=services),
            Scheduler(
                services=services,
                config=SchedulerConfig(
                    interval_seconds=settings.scheduler_interval_seconds,
                    batch_size=settings.scheduler_batch_size,
                ),
            ),
        ]
    return loops


@asynccontextmanager
async def lifespan(app: FastAPI, *, logs: AppLogs) -> AsyncIterator[None]:
    """Builds the pool, the control connection, the service and the loops; tears them down."""
    state = app_state(app)
    settings = state.settings
    url = _require_url(settings)
    # Checked before anything connects: an unusable file stops the start (ScheduleFileError).
    schedule_file = (
        load_schedules_file(settings.schedules, settings)
        if settings.schedules is not None
        else None
    )
    engine = create_engine(
        url,
        pool_size=settings.db_read_pool_size,
        max_overflow=settings.db_max_overflow,
        pool_timeout=settings.db_pool_timeout_seconds,
        statement_cache=settings.db_statement_cache,
        connect_timeout=settings.db_connect_timeout_seconds,
    )
    pool = await create_driver_pool(
        url,
        size=settings.db_pool_size,
        statement_cache=settings.db_statement_cache,
        connect_timeout=settings.db_connect_timeout_seconds,
    )
    # The control connection lives outside the pool: parked claims never hold a pooled one. It
    # holds session state (LISTEN, the leader lock), so it bypasses a transaction-mode pooler.
    control_engine = create_control_engine(
        settings.direct_database_url or url, connect_timeout=settings.db_connect_timeout_seconds
    )
    stores = stores_for(settings)
    if logs.summary is not None:
        # With --workers N the processes share a host: the summary says which one counted.
        logs.summary.instance = stores.jobs.instance
    hub = WaiterHub()
    results = ResultHub()  # parked job reads (GET /v1/jobs/{id}?wait_seconds=)
    keys = KeyRing(engine, interval_seconds=settings.auth_refresh_seconds)
    await _load_keys(keys)
    control = ControlChannel(
        engine=control_engine,
        store=stores.control,
        hub=hub,
        coalesce_window=settings.notify_coalesce_seconds,
        listeners={
            key_store.CHANNEL: ignoring_payload(keys.changed),
            FINISHED_CHANNEL: results.notified,
        },
    )
    announce = control.announce if settings.wakeup_announce else _announce_nothing
    services = build_services(
        unit=UnitOfWork(engine=engine, pool=pool, pool_timeout=settings.db_pool_timeout_seconds),
        coalescing=CoalescingPolicy(
            max_in_flight=settings.coalesce_max_in_flight, max_items=settings.coalesce_max_items
        )
        if settings.coalesce
        else None,
        stores=stores,
        defaults=JobDefaults(
            max_attempts=settings.max_attempts_default,
            lease_seconds=settings.lease_seconds_default,
        ),
        hub=hub,
        results=results,
        wake=announce,
        parent_results=ParentResultBounds(
            inline_bytes=settings.parent_result_inline_max_bytes,
            total_bytes=settings.parent_results_max_bytes,
        ),
        bulk_batch_size=settings.bulk_batch_size,
    )
    # Every committed change is announced from app/queue/events.py; these listen from the start.
    services.events.subscribe(logs.jobs)
    for subscriber in state.subscribers:
        services.events.subscribe(subscriber)
    runner = LoopRunner(
        lead=control.lead,
        loops=[*_loops(settings, services, hub), keys, *logs.loops()],
        election_interval=settings.election_interval_seconds,
        stall_intervals=settings.loop_stall_intervals,
        stall_min_seconds=settings.loop_stall_min_seconds,
    )
    loop = asyncio.get_running_loop()

    def close_waiters() -> None:
        hub.close()
        results.close()

    def begin_shutdown() -> None:
        loop.call_soon_threadsafe(close_waiters)

    state.runtime = Runtime(
        services=services,
        hub=hub,
        control=control,
        runner=runner,
        keys=keys,
        failures=FailureLimiter(settings.auth_failures_per_minute),
        begin_shutdown=begin_shutdown,
    )
    control.start()
    await control.wait_connected(CONTROL_CONNECT_WAIT_SECONDS)
    if not settings.db_statement_cache:
        await warn_if_jit(engine)
    await _publish_enqueue_limits(services, settings)
    runner.start()
    try:
        if settings.schedules is not None and schedule_file is not None:
            await _apply_schedules_file(services, settings.schedules, schedule_file)
        yield
    finally:
        close_waiters()
        await runner.stop()
        if logs.summary is not None:
            logs.summary.write()  # what the last interval counted
        await control.stop()
        await keys.stop()
        await control_engine.dispose()
        await pool.close()
        await engine.dispose()
        state.runtime = None


async def _publish_enqueue_limits(services: Services, settings: Settings) -> None:
    """Tells ``jobq.enqueue()`` (SQL producers) this instance's bounds and defaults; a database
    that refuses the write (a replica, an outage) keeps the ones it has."""
    limits = EnqueueLimits(
        queue_name_max_chars=settings.queue_name_max_chars,
        type_max_chars=settings.type_max_chars,
        idempotency_key_max_chars=settings.idempotency_key_max_chars,
        concurrency_key_max_chars=CONCURRENCY_KEY_MAX_CHARS,
        payload_max_bytes=settings.max_body_bytes,
        max_attempts_default=settings.max_attempts_default,
        lease_seconds_default=settings.lease_seconds_default,
        json_max_depth=settings.max_json_depth,
    )
    try:
        await services.upkeep.publish_enqueue_limits(limits)
    except (DBAPIError, OSError, DatabaseUnavailable) as exc:
        producers_logger.warning(
            "jobq.enqueue() bounds not written (%s); it keeps the stored ones", brief(exc)
        )


async def warn_if_jit(engine: AsyncEngine) -> None:
    """Behind a transaction-mode pooler jobq sets nothing per session: says so when JIT is on."""
    try:
        compiles = await jit_compiles(engine)
    except (DBAPIError, OSError) as exc:
        db_logger.warning("could not read the jit setting (%s)", brief(exc))
        return
    if compiles:
        db_logger.warning(
            "jit is on for jobq's sessions: short statements may spend hundreds of ms compiling; "
            "turn it off for jobq's role (ALTER ROLE ... SET jit = off) or in PgBouncer's "
            "connect_query (docs/deploying/production.md, PgBouncer)",
            extra={"event": "db.jit_on"},
        )


async def _load_keys(keys: KeyRing) -> None:
    """The first load of the keys; until one succeeds, requests are refused (503)."""
    try:
        await keys.refresh()
    except (DBAPIError, OSError) as exc:
        logger.warning("API keys not loaded yet (%s); requests get 503 until they are", brief(exc))
        return
    if not keys.enabled:
        logger.warning(
            "authentication is off: no API key exists (make one with `jobq keys create`)"
        )


async def _apply_schedules_file(
    services: Services, path: Path, entries: Sequence[tuple[str, ScheduleSpec]]
) -> None:
    """Applies JOBQ_SCHEDULES through the service: upserts its schedules, deletes the ones it dropped."""
    outcome = await services.schedules.sync(entries, actor=f"file:{path}"[:255])
    schedule_logger.info(
        "schedules file %s applied: %d created, %d updated, %d unchanged, %d deleted",
        path,
        len(outcome.created),
        len(outcome.updated),
        len(outcome.unchanged),
        len(outcome.deleted),
        extra={"event": "schedules.applied", "deleted": list(outcome.deleted)},
    )


def _announce_nothing(queue: str, count: int) -> None:
    """Wake-ups switched off (``JOBQ_WAKEUP_ANNOUNCE=false``): waiters rely on the backstop."""


def create_app(settings: Settings) -> FastAPI:
    """Builds the app for these settings; nothing is connected until the lifespan starts."""
    # FastAPI's own /docs and /redoc load their assets from a CDN: app/dashboard/docs.py serves
    # /docs from this process instead, and ReDoc not at all.
    state = AppState(settings=settings)
    observed = metrics.AppMetrics(state)
    logs = AppLogs.from_settings(settings, durations=observed.requests)
    app = JobqAPI(
        title="jobq",
        version="0.1.0",
        description=API_DESCRIPTION,
        lifespan=partial(lifespan, logs=logs),
        docs_url=None,
        redoc_url=None,
    )
    # Not FastAPI's own max_body_size: its limiter answers outside our handlers, in plain text.
    app.body_limit_bytes = settings.max_body_bytes
    app.max_json_depth = settings.max_json_depth
    app.cors_origins = [o.strip() for o in settings.cors_origins.split(",") if o.strip()]
    app.state.jobq = state
    state.subscribers.append(observed.jobs)
    # Request timing outermost, so it covers every layer; then request ids and the access log.
    app.outer = [observed.timer(app), logs.request_ids]
    install_error_handlers(app)
    app.add_middleware(BodyLimit, max_body_size=settings.max_body_bytes)
    # The routes go on the app's own router: FastAPI 0.165 matches an included router's
    # routes through a wrapper that cost about a tenth of a hot request's CPU (measured).
    for router in (
        jobs.build_router(settings),
        workers.build_router(settings),
        ops.build_router(settings),
        schedules.build_router(settings),
        flow_limits.build_router(),
        history.build_router(),
        maintenance.build_router(),
        workflows.build_router(settings),
        webhooks.build_router(settings),
        observed.router(),
        # Server-rendered pages and their static files, none of them in the OpenAPI document.
        dashboard.build_router(settings),
        api_docs.build_router(title=app.title, openapi_url=app.openapi_url or "/openapi.json"),
    ):
        app.router.routes.extend(router.routes)
    return app
