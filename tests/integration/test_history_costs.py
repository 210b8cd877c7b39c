"""Costs that must not grow with history: each statement touches rows bounded by its batch or answer.

Seeded as ``bench/plans.py`` seeds (200,000 finished jobs, 50,000 scheduled for tomorrow at a
higher priority, a small backlog) and measured the same way, from
``EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON)``. Runs on the session's server (the embedded
PostgreSQL 18 by default), and also on the server in ``JOBQ_PLAN_DATABASE_URL`` when set
(``.ci/run`` points it at the machine's PostgreSQL 15, where no skip scan hides a bad plan).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import NullPool

from app.db import async_url
from bench.plans import (
    DUE_PER_CLAIM_QUEUE,
    Explained,
    buffers,
    explain,
    move_scheduled_to,
    nodes,
    probes,
    repository,
    seed_history,
)
from tests.integration.helpers import PLAN_SERVERS, migrated_database

PAGE = 51  # the probes' listing limit
STATES = 6
MAX_JOBS = 100


@pytest.fixture(scope="module", params=PLAN_SERVERS)
def history_url(request: pytest.FixtureRequest, pg_server_url: str) -> Iterator[str]:
    yield from migrated_database(request.param, pg_server_url, "jobq_history")


@pytest.fixture(scope="module")
async def plans(history_url: str) -> AsyncIterator[dict[str, Explained]]:
    engine: AsyncEngine = create_async_engine(async_url(history_url), poolclass=NullPool)
    try:
        async with engine.begin() as conn:
            await seed_history(conn)
            await move_scheduled_to(conn, "c0-later")
        measured: dict[str, Explained] = {}
        async with engine.connect() as conn:
            for name, probe in probes(repository()).items():
                [plan] = await explain(conn, lambda c, p=probe: p(c, None))
                measured[name] = plan
        yield measured
    finally:
        await engine.dispose()


def _no_seq_scan_of_jobs(plan: Explained) -> None:
    seq = [
        n
        for n in nodes(plan.plan)
        if n["Node Type"] == "Seq Scan" and n.get("Relation Name") == "jobs"
    ]
    assert not seq, seq


async def test_the_pruner_with_nothing_to_prune_reads_nothing(plans: dict[str, Explained]) -> None:
    plan = plans["pruner, nothing to prune"]
    assert plan.touched == 0 and buffers(plan.plan) <= 50, (plan.touched, buffers(plan.plan))
    assert "ix_jobs_finished_status_finished_at" in plan.indexes()


async def test_queue_counts_come_from_the_counters(plans: dict[str, Explained]) -> None:
    plan = plans["GET /v1/queues"]
    _no_seq_scan_of_jobs(plan)
    # Counter rows (queues x states x shards) and one index probe per queue, never the history.
    assert plan.touched <= 200 and buffers(plan.plan) <= 200, (plan.touched, buffers(plan.plan))


@pytest.mark.parametrize(
    "name", ["list queue=busy0&type=rare (51 rows)", "list queue=small (51 oldest rows)"]
)
async def test_a_listing_by_queue_reads_at_most_a_page_per_state(
    plans: dict[str, Explained], name: str
) -> None:
    plan = plans[name]
    _no_seq_scan_of_jobs(plan)
    assert plan.touched <= STATES * (PAGE + 1), plan.touched


async def test_a_listing_by_state_reads_at_most_a_page_per_queue(
    plans: dict[str, Explained],
) -> None:
    plan = plans["list status=dead, no queue"]
    _no_seq_scan_of_jobs(plan)
    queues = 9  # busy0..3, small, c0..2, c0-later
    assert plan.touched <= queues * (PAGE + 1), plan.touched


async def test_jobs_scheduled_for_tomorrow_cost_a_claim_nothing(
    plans: dict[str, Explained],
) -> None:
    for name in (
        "claim, only tomorrow's jobs in the queue",
        "long-poll backstop, only tomorrow's jobs",
    ):
        plan = plans[name]
        assert plan.touched == 0 and buffers(plan.plan) <= 20, (
            name,
            plan.touched,
            buffers(plan.plan),
        )


async def test_a_claim_over_three_queues_locks_only_what_it_takes(
    plans: dict[str, Explained],
) -> None:
    plan = plans["claim 3 queues, max_jobs=100"]
    _no_seq_scan_of_jobs(plan)
    # EXPLAIN shows per-loop averages rounded, so three loops of 33.33 read as 99.
    assert MAX_JOBS - 1 <= plan.locked <= MAX_JOBS, plan.locked
    assert DUE_PER_CLAIM_QUEUE >= MAX_JOBS
    # One look at each queue's head, one locking walk, one update per taken row.
    assert plan.touched <= 3 * MAX_JOBS + MAX_JOBS + MAX_JOBS + 10, plan.touched
