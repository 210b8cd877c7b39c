"""Settle-and-claim calls take one transaction while few run, the coalescers when many do.

A call's transition and claim in one transaction share PostgreSQL's ``now()`` (the
transaction's start), so the completed job's ``finished_at`` equals the claimed job's
``started_at``; through the coalescers they are two commits, one after the other.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db import create_driver_pool
from app.domain.records import Job
from app.domain.types import ClaimAsk, LeaseTransition, LeaseUpdate
from app.queue.chained import SHARED_FROM_RUNNING, Chained
from app.queue.jobs import CoalescingPolicy
from app.queue.services import Services
from app.store.conn import DriverConn
from tests.integration.helpers import seed_jobs, service
from tests.locks import lock_waiters
from tests.polling import poll_until


async def _times(engine: AsyncEngine, done: int, taken: int) -> tuple[Any, Any]:
    async with engine.connect() as conn:
        finished = await conn.scalar(
            text("SELECT finished_at FROM jobs WHERE id = :id"), {"id": done}
        )
        started = await conn.scalar(
            text("SELECT started_at FROM jobs WHERE id = :id"), {"id": taken}
        )
    return finished, started


def _complete(svc: Services, job: Job) -> Any:
    return svc.chained.settle_and_claim(
        LeaseTransition.COMPLETE,
        worker_id="w",
        key_id=None,
        items=[LeaseUpdate(job_id=job.id, lease_id=str(job.lease_id))],
        ask=ClaimAsk(queues=("default",), max_jobs=1, lease_seconds=30),
    )


@pytest.fixture
async def roomy_pool(database_url: str) -> AsyncIterator[Any]:
    """Room for the blocked calls' connections and the shared statements'."""
    pool = await create_driver_pool(
        database_url, size=SHARED_FROM_RUNNING + 4, application_name="jobq-tests"
    )
    yield pool
    await pool.close()


async def test_calls_beyond_the_first_few_running_share_the_coalesced_statements(
    clean_db: AsyncEngine, roomy_pool: Any
) -> None:
    svc = service(clean_db, roomy_pool, coalescing=CoalescingPolicy(max_in_flight=2, max_items=100))
    few = SHARED_FROM_RUNNING
    await seed_jobs(clean_db, 2 * (few + 1))
    held = await svc.jobs.claim(
        worker_id="w", queues=["default"], max_jobs=few + 1, lease_seconds=30
    )
    assert len(held) == few + 1
    async with clean_db.connect() as holder:
        # The first few calls' completes wait for their rows, in transactions of their own.
        await holder.execute(
            text("SELECT 1 FROM jobs WHERE id = ANY(:ids) FOR UPDATE"),
            {"ids": [job.id for job in held[:few]]},
        )
        blocked = [asyncio.create_task(_complete(svc, job)) for job in held[:few]]
        await poll_until(
            lambda: _waiting(clean_db, few),
            within=30,
            what="the first calls waiting for their rows",
        )
        # One more: it goes out with the coalesced completes and claims, two commits.
        shared: Chained = await asyncio.wait_for(_complete(svc, held[few]), 30)
        assert [o.ok for o in shared.outcomes] == [True] and shared.claim_error is None
        [next_job] = shared.claimed
        finished, started = await _times(clean_db, held[few].id, next_job.id)
        assert finished < started, "the claim committed after the transition, apart"
        await holder.rollback()
    async with asyncio.timeout(30):
        answers: list[Chained] = [await task for task in blocked]
    for job, answer in zip(held[:few], answers, strict=True):
        assert [o.ok for o in answer.outcomes] == [True] and len(answer.claimed) == 1
        finished, started = await _times(clean_db, job.id, answer.claimed[0].id)
        assert finished == started, "transition and claim in one transaction"


async def _waiting(engine: AsyncEngine, n: int) -> bool:
    return await lock_waiters(engine) == n


@pytest.fixture
def statements_run(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the statements the hot pool runs from now on, in order."""
    names: list[str] = []
    original = DriverConn.fetch

    async def recording(self: DriverConn, name: str, params: Any = None) -> Any:
        names.append(name)
        return await original(self, name, params)

    monkeypatch.setattr(DriverConn, "fetch", recording)
    return names


async def test_a_complete_and_its_claim_without_limits_are_one_statement(
    clean_db: AsyncEngine, svc: Services, statements_run: list[str]
) -> None:
    """One round trip and one commit (job_complete_claim); the counters see both moves."""
    await seed_jobs(clean_db, 3)
    [held] = await svc.jobs.claim(worker_id="w", queues=["default"], max_jobs=1, lease_seconds=30)
    statements_run.clear()
    answer: Chained = await _complete(svc, held)
    assert statements_run == ["job_complete_claim"]
    assert [o.status for o in answer.outcomes] == ["succeeded"] and answer.claim_error is None
    [taken] = answer.claimed
    assert taken.status == "running" and taken.worker_id == "w" and taken.id != held.id
    finished, started = await _times(clean_db, held.id, taken.id)
    assert finished == started, "one statement: one now()"
    async with clean_db.connect() as conn:
        counted = dict(
            (
                await conn.execute(
                    text("SELECT status, sum(jobs) FROM queue_counts GROUP BY status")
                )
            ).all()
        )
    assert {s: n for s, n in counted.items() if n} == {"pending": 1, "running": 1, "succeeded": 1}


async def test_a_lost_lease_is_judged_after_the_statement_and_the_claim_still_made(
    clean_db: AsyncEngine, svc: Services, statements_run: list[str]
) -> None:
    await seed_jobs(clean_db, 2)
    [held] = await svc.jobs.claim(worker_id="w", queues=["default"], max_jobs=1, lease_seconds=30)
    await svc.ops.cancel(held.id)  # the lease is lost
    statements_run.clear()
    answer: Chained = await _complete(svc, held)
    assert statements_run == ["job_complete_claim", "job_lease_verdict"]
    [outcome] = answer.outcomes
    assert outcome.cancelled and outcome.job_id == held.id, outcome
    assert len(answer.claimed) == 1 and answer.claim_error is None


async def test_a_complete_of_several_answers_each_lease_in_order_beside_several_claimed(
    clean_db: AsyncEngine, svc: Services, statements_run: list[str]
) -> None:
    await seed_jobs(clean_db, 7)
    held = await svc.jobs.claim(worker_id="w", queues=["default"], max_jobs=3, lease_seconds=30)
    statements_run.clear()
    answer: Chained = await svc.chained.settle_and_claim(
        LeaseTransition.COMPLETE,
        worker_id="w",
        key_id=None,
        items=[LeaseUpdate(job_id=j.id, lease_id=str(j.lease_id)) for j in reversed(held)],
        ask=ClaimAsk(queues=("default",), max_jobs=4, lease_seconds=30),
    )
    assert statements_run == ["job_complete_claim"]
    assert [(o.job_id, o.status) for o in answer.outcomes] == [
        (j.id, "succeeded") for j in reversed(held)
    ]
    assert len(answer.claimed) == 4 and not {j.id for j in answer.claimed} & {j.id for j in held}
