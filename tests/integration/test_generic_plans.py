"""Every statement the hot pool runs has a generic plan that reads through indexes.

The hot pool keeps one generic plan per prepared statement (``plan_cache_mode`` is
``force_generic_plan`` on its connections, app/db.py): planning again on every call cost about
as much as running a one-job claim. A generic plan is made without the parameters' values, so a
statement whose plan only works for small values (a join that guesses hundreds of picked rows
and hashes a scan of the whole table) would read the whole history on every call.

The statements are the ones a real day of the queue runs: the scenario below goes through the
services on the hot pool while each named statement and its arguments are recorded, then each
is explained as ``EXECUTE`` of a prepared statement under ``force_generic_plan`` on a long
history (``bench/plans.py``'s seed), on each plan server.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import NullPool

from app.db import async_url, create_driver_pool, create_engine, driver_dsn, jit_compiles
from app.domain.cron import JobTemplate, ScheduleSpec, Timing
from app.domain.types import ClaimAsk, LeaseTransition, LeaseUpdate, NewJob, PlainJobs
from app.domain.workflows import StepSpec
from app.main import warn_if_jit
from app.store.conn import DriverConn, Row
from app.store.statements import statement
from bench.plans import nodes, seed_history
from tests.integration.helpers import PLAN_SERVERS, migrated_database, service

# Tables whose size follows the history: a generic plan must not scan them whole.
HISTORY_TABLES = {"jobs", "job_events"}


async def _seed_backlog(conn: Any) -> None:
    """A backlog of 5,000 jobs and no history: where a hash join over a scan of the table
    looked cheaper to the planner than probing the primary key for the rows a claim picked."""
    await conn.exec_driver_sql(
        "INSERT INTO jobs (queue, type, status, max_attempts, lease_seconds) "
        "SELECT 'hot', 't', 'pending', 10, 30 FROM generate_series(1, 5000)"
    )


async def _seed_history(conn: Any) -> None:
    await seed_history(conn, finished=50_000, scheduled=10_000)


SEEDS = {"history": _seed_history, "backlog": _seed_backlog}


# The backlog on every plan server (where the plans went wrong); the long history once, on the
# session's server (CI's time is counted).
@pytest.fixture(
    scope="module", params=[(s, "backlog") for s in PLAN_SERVERS] + [("session", "history")]
)
def seeded(request: pytest.FixtureRequest, pg_server_url: str) -> Iterator[tuple[str, str]]:
    """A migrated database on a plan server, and the name of the seed it gets."""
    server, seed = request.param
    for url in migrated_database(server, pg_server_url, "jobq_generic"):
        yield url, seed


@pytest.fixture(scope="module")
def history_url(seeded: tuple[str, str]) -> str:
    return seeded[0]


@pytest.fixture(scope="module")
async def recorded(seeded: tuple[str, str]) -> AsyncIterator[dict[str, list[Any]]]:
    """The hot statements of a scenario on a long history, each with its first arguments."""
    history_url, seed = seeded
    engine: AsyncEngine = create_async_engine(async_url(history_url), poolclass=NullPool)
    pool = await create_driver_pool(history_url, size=2, application_name="jobq-tests")
    calls: dict[str, list[Any]] = {}
    original = DriverConn.fetch

    async def recording(
        self: DriverConn, name: str, params: Mapping[str, Any] | None = None
    ) -> Sequence[Row]:
        calls.setdefault(name, statement(name).arguments(dict(params or {})))
        return await original(self, name, params)

    try:
        async with engine.begin() as conn:
            await SEEDS[seed](conn)
        async with engine.begin() as conn:
            await conn.exec_driver_sql("ANALYZE jobs")
        svc = service(engine, pool)
        DriverConn.fetch = recording  # type: ignore[method-assign]
        try:
            await _day_of_the_queue(svc)
        finally:
            DriverConn.fetch = original  # type: ignore[method-assign]
        yield calls
    finally:
        await pool.close()
        await engine.dispose()


async def _day_of_the_queue(svc: Any) -> None:
    """Enqueues (single, batch, keyed, delayed), claims of one and of many queues, every lease
    call, and a read of a job."""
    await svc.jobs.enqueue([NewJob(queue="hot", type="t", payload={"n": 1})])
    # A plain batch: the request's own fields, the defaults filled in by the statement.
    await svc.jobs.enqueue_plain(PlainJobs([{"queue": "cold", "type": "t", "payload": 2}] * 2))
    await svc.jobs.enqueue(
        [NewJob(queue="hot", type="t", idempotency_key=f"k{n}") for n in range(5)]
        + [NewJob(queue="other", type="t", delay_seconds=3600)]
    )
    got = await svc.jobs.claim(worker_id="w", queues=["hot"], max_jobs=1, lease_seconds=30)
    got += await svc.jobs.claim(
        worker_id="w", queues=["hot", "other"], max_jobs=5, lease_seconds=30
    )
    items = [LeaseUpdate(job_id=j.id, lease_id=str(j.lease_id)) for j in got]
    assert len(items) == 6
    await svc.jobs.heartbeat(worker_id="w", items=items[:2])
    await svc.jobs.complete(worker_id="w", items=items[:1])
    # A complete that claims the worker's next job in the same statement (claim_next).
    await svc.jobs.enqueue([NewJob(queue="hot", type="t")])
    chained = await svc.chained.settle_and_claim(
        LeaseTransition.COMPLETE,
        worker_id="w",
        key_id=None,
        items=items[1:2],
        ask=ClaimAsk(queues=("hot",)),
    )
    assert chained.claim_error is None and len(chained.claimed) == 1
    [taken] = chained.claimed
    await svc.jobs.fail(worker_id="w", items=items[2:3])
    await svc.jobs.fail(worker_id="w", items=[replace(items[4], retryable=False)])
    await svc.jobs.release(worker_id="w", items=items[5:])
    # A fail and a release that claim the next job in the same statement.
    await svc.jobs.enqueue([NewJob(queue="hot", type="t") for _ in range(2)])
    for transition, item in (
        (LeaseTransition.FAIL, items[3]),
        (LeaseTransition.RELEASE, LeaseUpdate(job_id=taken.id, lease_id=str(taken.lease_id))),
    ):
        settled = await svc.chained.settle_and_claim(
            transition, worker_id="w", key_id=None, items=[item], ask=ClaimAsk(queues=("hot",))
        )
        assert settled.claim_error is None and [o.ok for o in settled.outcomes] == [True]
        assert len(settled.claimed) == 1
    await svc.jobs.get(items[0].job_id)
    # Composed work: a child of a finished job, an ordered pair.
    await svc.jobs.enqueue(
        [
            NewJob(queue="hot", type="t", depends_on=(items[0].job_id,)),
            NewJob(queue="hot", type="t", ordering_key="o"),
            NewJob(queue="hot", type="t", ordering_key="o"),
        ]
    )
    assert await svc.workflows.parent_queues([items[0].job_id]) == {items[0].job_id: "hot"}
    await svc.workflows.unstick_ordering_keys(recent_seconds=10)
    await _composed_and_awaited(svc)
    # With a limit: the limited claim and its flow rows.
    await svc.limits.put(
        scope="key",
        pattern="k*",
        max_running=2,
        rate_limit=None,
        rate_per_seconds=None,
        actor="test",
        actor_key_id=None,
    )
    await svc.jobs.enqueue(
        [NewJob(queue="hot", type="t", concurrency_key=f"k{n}") for n in range(4)]
    )
    limited = await svc.jobs.claim(worker_id="w", queues=["hot"], max_jobs=3, lease_seconds=30)
    # A complete that claims the next job within the limits, in the same statement.
    chained = await svc.chained.settle_and_claim(
        LeaseTransition.COMPLETE,
        worker_id="w",
        key_id=None,
        items=[LeaseUpdate(job_id=limited[0].id, lease_id=str(limited[0].lease_id))],
        ask=ClaimAsk(queues=("hot",)),
    )
    assert chained.claim_error is None and [o.ok for o in chained.outcomes] == [True]
    # A fail and a release that claim within the limits, in the same statement.
    held = [*chained.claimed]
    for transition, job in (
        (LeaseTransition.FAIL, limited[1]),
        (LeaseTransition.RELEASE, limited[2]),
    ):
        settled = await svc.chained.settle_and_claim(
            transition,
            worker_id="w",
            key_id=None,
            items=[LeaseUpdate(job_id=job.id, lease_id=str(job.lease_id))],
            ask=ClaimAsk(queues=("hot",)),
        )
        assert settled.claim_error is None and [o.ok for o in settled.outcomes] == [True]
        held += settled.claimed
    await svc.jobs.complete(
        worker_id="w",
        items=[LeaseUpdate(job_id=j.id, lease_id=str(j.lease_id)) for j in held],
    )


async def _composed_and_awaited(svc: Any) -> None:
    """A workflow of two steps, the claim that hands the second its parent's result, an awaited
    job, and a pass of the scheduler over a due schedule: their hot statements too."""
    view = await svc.workflows.create(
        name="wf",
        steps=[
            StepSpec(name="a", after=(), job=NewJob(queue="flow", type="t")),
            StepSpec(name="b", after=("a",), job=NewJob(queue="flow", type="t")),
        ],
    )
    for _ in view.steps:
        [step] = await svc.jobs.claim(worker_id="w", queues=["flow"], max_jobs=1, lease_seconds=30)
        await svc.jobs.complete(
            worker_id="w",
            items=[LeaseUpdate(job_id=step.id, lease_id=str(step.lease_id), result=1)],
        )
    [(awaited, _)] = await svc.jobs.enqueue([NewJob(queue="flow", type="t")])
    waited = await svc.results.wait(awaited.id, wait_seconds=0.05)
    assert waited.status == "pending"
    await svc.schedules.put(
        "every-minute",
        ScheduleSpec(
            timing=Timing(cron=None, interval_seconds=60, timezone="UTC"),
            template=JobTemplate(queue="periodic", type="tick"),
        ),
    )
    ran = await svc.schedules.enqueue_runs(
        batch_size=10, now=datetime.now(UTC) + timedelta(minutes=2)
    )
    assert ran.enqueued >= 1, ran


async def _generic_plan(url: str, sql: str, arguments: list[Any]) -> dict[str, Any]:
    conn = await asyncpg.connect(driver_dsn(url))
    try:
        # EXECUTE takes no bind parameters: each argument goes in as a literal of its type,
        # rendered by the server from the value the driver would bind.
        literals = []
        for parameter, value in zip(
            (await conn.prepare(sql)).get_parameters(), arguments, strict=True
        ):
            kind = await conn.fetchval("SELECT format_type($1, NULL)", parameter.oid)
            literal = await conn.fetchval(f"SELECT quote_nullable(CAST($1 AS {kind}))", value)
            literals.append(f"CAST({literal} AS {kind})")
        await conn.execute("SET plan_cache_mode = force_generic_plan")
        await conn.execute(f"PREPARE probe AS {sql}")
        execute = f"EXECUTE probe({', '.join(literals)})" if literals else "EXECUTE probe"
        async with conn.transaction():  # explained only: nothing runs, nothing is kept
            text = await conn.fetchval(f"EXPLAIN (FORMAT JSON) {execute}")
        plan: dict[str, Any] = json.loads(text)[0]["Plan"]
        return plan
    finally:
        await conn.close()


async def test_the_scenario_ran_the_hot_statements(recorded: dict[str, list[Any]]) -> None:
    assert {
        "job_enqueue",
        "job_enqueue_plain",
        "job_claim",
        "job_heartbeat",
        "job_complete",
        "job_complete_claim",
        "job_fail",
        "job_release",
        "job_get",
        "job_claim_limited",
        "job_complete_claim_limited",
        "job_fail_claim",
        "job_fail_claim_limited",
        "job_release_claim",
        "job_release_claim_limited",
        "workflow_create",
        "job_ids_reserve",
        "job_parent_outcomes",
        "job_await_mark",
        "schedule_due",
        "schedule_advance",
        "schedule_run_enqueue",
    } <= set(recorded)


async def test_no_generic_plan_of_a_hot_statement_scans_the_history(
    recorded: dict[str, list[Any]], history_url: str
) -> None:
    scans = {}
    for name, arguments in sorted(recorded.items()):
        plan = await _generic_plan(history_url, statement(name).positional[0], arguments)
        seq = [
            node["Relation Name"]
            for node in nodes(plan)
            if node["Node Type"] == "Seq Scan" and node.get("Relation Name") in HISTORY_TABLES
        ]
        if seq:
            scans[name] = seq
    assert not scans, scans


async def test_the_engine_turns_jit_off_but_not_through_a_transaction_pooler(
    database_url: str,
) -> None:
    # GET /v1/queues (and the metrics refresh every 10 s) compiled for 440 ms of a 1 ms
    # statement on a 40,000-job database (PostgreSQL 15, jit on by default).
    async def jit_of(statement_cache: bool) -> str:
        engine = create_engine(
            database_url,
            pool_size=1,
            max_overflow=0,
            pool_timeout=10,
            statement_cache=statement_cache,
        )
        try:
            async with engine.connect() as conn:
                setting = await conn.exec_driver_sql("SELECT current_setting('jit')")
            if statement_cache:
                assert await jit_compiles(engine) is False
            return str(setting.scalar())
        finally:
            await engine.dispose()

    conn = await asyncpg.connect(driver_dsn(database_url))
    try:
        server_default = await conn.fetchval("SELECT current_setting('jit')")
    finally:
        await conn.close()
    assert await jit_of(statement_cache=True) == "off"
    # Behind a pooler a SET would outlive the client on the server session: left as it is.
    assert await jit_of(statement_cache=False) == server_default


@pytest.mark.parametrize("jit", ["on", "off"])
async def test_behind_a_pooler_the_service_warns_when_its_sessions_may_jit_compile(
    database_url: str, jit: str, caplog: pytest.LogCaptureFixture
) -> None:
    # A pooler's sessions get what the role or PgBouncer's connect_query set, not a startup
    # parameter (PgBouncer refuses unknown ones): the server's setting stands in for that here.
    engine = create_async_engine(
        async_url(database_url),
        poolclass=NullPool,
        connect_args={"server_settings": {"jit": jit}},
    )
    try:
        async with engine.connect() as conn:
            available = (await conn.exec_driver_sql("SELECT pg_jit_available()")).scalar()
        with caplog.at_level(logging.WARNING, logger="jobq.db"):
            await warn_if_jit(engine)
    finally:
        await engine.dispose()
    warned = [r for r in caplog.records if getattr(r, "event", None) == "db.jit_on"]
    assert len(warned) == (1 if jit == "on" and available else 0)


async def test_the_hot_pool_never_jit_compiles_its_plans(driver_pool: Any) -> None:
    # A generic plan's cost is estimated for any parameters: the limited claim's passed
    # jit_above_cost on a 100,000-job backlog (11 million), and compiling it took 3.3 s of
    # every 12 ms claim (measured on PostgreSQL 15 with jit on, its default).
    async with driver_pool.acquire() as conn:
        settings = await conn.fetchrow(
            "SELECT current_setting('jit') AS jit, current_setting('plan_cache_mode') AS plans"
        )
    assert dict(settings) == {"jit": "off", "plans": "force_generic_plan"}
