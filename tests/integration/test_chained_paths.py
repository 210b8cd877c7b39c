"""Settle-and-claim calls: a complete, a fail or a release and its claim are one statement, which
concurrent calls of the same transition share.

A call's transition and claim in one statement (or one transaction) share PostgreSQL's
``now()`` (the transaction's start), so the settled job's ``updated_at`` equals the claimed
job's ``started_at``; a claim after the commit comes later.
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db import create_driver_pool
from app.domain.records import Job
from app.domain.types import ClaimAsk, LeaseTransition, LeaseUpdate, NewJob
from app.queue.chained import Chained
from app.queue.jobs import CoalescingPolicy
from app.queue.services import Services
from app.store.conn import DriverConn
from tests.integration.helpers import seed_jobs, service
from tests.locks import lock_waiters
from tests.polling import poll_until


async def _times(engine: AsyncEngine, done: int, taken: int) -> tuple[Any, Any]:
    async with engine.connect() as conn:
        finished = await conn.scalar(
            text("SELECT updated_at FROM jobs WHERE id = :id"), {"id": done}
        )
        started = await conn.scalar(
            text("SELECT started_at FROM jobs WHERE id = :id"), {"id": taken}
        )
    return finished, started


def _complete(svc: Services, job: Job, worker_id: str = "w") -> Any:
    return _settle(svc, job, LeaseTransition.COMPLETE, worker_id)


def _settle(svc: Services, job: Job, transition: LeaseTransition, worker_id: str = "w") -> Any:
    return svc.chained.settle_and_claim(
        transition,
        worker_id=worker_id,
        key_id=None,
        items=[LeaseUpdate(job_id=job.id, lease_id=str(job.lease_id))],
        ask=ClaimAsk(queues=("default",), max_jobs=1, lease_seconds=30),
    )


@pytest.fixture
async def roomy_pool(database_url: str) -> AsyncIterator[Any]:
    """Room for the blocked calls' connections and the shared statements'."""
    pool = await create_driver_pool(database_url, size=8, application_name="jobq-tests")
    yield pool
    await pool.close()


@pytest.mark.parametrize("transition", [LeaseTransition.FAIL, LeaseTransition.RELEASE])
async def test_a_job_a_fail_or_release_makes_pending_is_claimed_after_the_commit_when_short(
    clean_db: AsyncEngine, roomy_pool: Any, statements_run: list[str], transition: LeaseTransition
) -> None:
    """The claim of the shared statement cannot see the job its transition gave back (one
    snapshot): a call whose claim came back short claims again once it committed, as a claim
    after the transition in the same transaction did."""
    svc = service(clean_db, roomy_pool, coalescing=CoalescingPolicy(max_in_flight=2, max_items=100))
    await seed_jobs(clean_db, 2)
    held = await svc.jobs.claim(worker_id="w", queues=["default"], max_jobs=2, lease_seconds=30)
    statements_run.clear()
    [job, other] = held
    answer: Chained = await svc.chained.settle_and_claim(
        transition,
        worker_id="w",
        key_id=None,
        items=[LeaseUpdate(job_id=job.id, lease_id=str(job.lease_id), retry_after_seconds=0)],
        ask=ClaimAsk(queues=("default",), max_jobs=2, lease_seconds=30),
    )
    assert [(o.job_id, o.status) for o in answer.outcomes] == [(job.id, "pending")]
    [again] = answer.claimed
    assert again.id == job.id and again.worker_id == "w" and again.lease_id != job.lease_id
    assert statements_run == [f"job_{transition.value}_claim", "job_claim"]
    # A fail charged the attempt, a release gave it back.
    assert again.attempts == (2 if transition is LeaseTransition.FAIL else 1)
    async with clean_db.connect() as conn:
        status = await conn.scalar(text("SELECT status FROM jobs WHERE id = :id"), {"id": other.id})
    assert status == "running"


async def _limit_keys(svc: Services, *, max_running: int) -> None:
    """A running limit on every concurrency key k*."""
    await svc.limits.put(
        scope="key",
        pattern="k*",
        max_running=max_running,
        rate_limit=None,
        rate_per_seconds=None,
        actor="test",
        actor_key_id=None,
    )


async def _waiting(engine: AsyncEngine, n: int) -> bool:
    return await lock_waiters(engine) == n


@pytest.mark.parametrize(
    ("transition", "settled_as"),
    [
        (LeaseTransition.COMPLETE, "succeeded"),
        (LeaseTransition.FAIL, "scheduled"),
        (LeaseTransition.RELEASE, "pending"),
    ],
)
async def test_concurrent_settles_share_one_statement_each_call_its_own_leases_and_claims(
    clean_db: AsyncEngine,
    roomy_pool: Any,
    statements_run: list[str],
    transition: LeaseTransition,
    settled_as: str,
) -> None:
    """Calls that arrive while a settle-and-claim of theirs runs go out together in the next
    one: one commit, each call's verdicts its own, each call's claim leased to its own worker."""
    svc = service(clean_db, roomy_pool, coalescing=CoalescingPolicy(max_in_flight=1, max_items=100))
    callers = 5
    await seed_jobs(clean_db, 2 * (callers + 1))
    first = (
        await svc.jobs.claim(worker_id="w0", queues=["default"], max_jobs=1, lease_seconds=30)
    )[0]
    held = {
        f"w{i}": (
            await svc.jobs.claim(
                worker_id=f"w{i}", queues=["default"], max_jobs=1, lease_seconds=30
            )
        )[0]
        for i in range(1, callers + 1)
    }
    # A stale lease among them: its call answers lease_lost and still claims.
    stale = dataclasses.replace(held["w3"], lease_id=uuid.uuid4())
    statements_run.clear()
    async with clean_db.connect() as holder:
        # The first call's statement waits for its row, and holds the only statement in flight.
        await holder.execute(text("SELECT 1 FROM jobs WHERE id = :id FOR UPDATE"), {"id": first.id})
        blocked = asyncio.create_task(_settle(svc, first, transition, "w0"))
        await poll_until(lambda: _waiting(clean_db, 1), within=30, what="the first statement")
        calls = {
            worker: asyncio.create_task(
                _settle(svc, stale if worker == "w3" else job, transition, worker)
            )
            for worker, job in held.items()
        }
        await poll_until(
            lambda: _true(svc.chained.waiting(("default",), transition) == callers),
            within=30,
            what="the other calls waiting for the next statement",
        )
        await holder.rollback()
    async with asyncio.timeout(30):
        alone: Chained = await blocked
        answers: dict[str, Chained] = {w: await task for w, task in calls.items()}
    assert statements_run == [f"job_{transition.value}_claim"] * 2 + ["job_lease_verdict"]
    assert [o.ok for o in alone.outcomes] == [True] and len(alone.claimed) == 1
    claimed = [alone.claimed[0].id]
    expected_owners = {alone.claimed[0].id: "w0"}
    for worker, answer in answers.items():
        [outcome] = answer.outcomes
        assert outcome.job_id == held[worker].id
        assert outcome.ok == (worker != "w3"), (worker, outcome)
        [taken] = answer.claimed
        assert (
            taken.worker_id == worker and taken.status == "running" and answer.claim_error is None
        )
        claimed.append(taken.id)
        expected_owners[taken.id] = worker
        finished, started = await _times(clean_db, held[worker].id, taken.id)
        if worker != "w3":
            assert finished == started, "its transition and its claim in one statement"
    assert len(set(claimed)) == len(claimed) == callers + 1, "each job leased once"
    async with clean_db.connect() as conn:
        owners = dict(
            (
                await conn.execute(
                    text("SELECT id, worker_id FROM jobs WHERE id = ANY(:ids)"), {"ids": claimed}
                )
            ).all()
        )
        states = dict(
            (
                await conn.execute(
                    text("SELECT id, status FROM jobs WHERE id = ANY(:ids)"),
                    {"ids": [job.id for job in held.values()]},
                )
            ).all()
        )
    assert owners == expected_owners
    assert states == {
        job.id: "running" if worker == "w3" else settled_as for worker, job in held.items()
    }


async def _true(value: bool) -> bool:
    return value


async def test_a_shared_complete_that_fails_runs_again_for_each_call_on_its_own(
    clean_db: AsyncEngine, roomy_pool: Any, statements_run: list[str]
) -> None:
    """One call's bad item fails that call's statement only (the others share theirs), and the
    failing call then runs as two statements, which answer its transition's error."""
    svc = service(clean_db, roomy_pool, coalescing=CoalescingPolicy(max_in_flight=1, max_items=100))
    await seed_jobs(clean_db, 6)
    first = (
        await svc.jobs.claim(worker_id="w0", queues=["default"], max_jobs=1, lease_seconds=30)
    )[0]
    good = (await svc.jobs.claim(worker_id="w1", queues=["default"], max_jobs=1, lease_seconds=30))[
        0
    ]
    bad = (await svc.jobs.claim(worker_id="w2", queues=["default"], max_jobs=1, lease_seconds=30))[
        0
    ]
    async with clean_db.connect() as holder:
        await holder.execute(text("SELECT 1 FROM jobs WHERE id = :id FOR UPDATE"), {"id": first.id})
        blocked = asyncio.create_task(_complete(svc, first, "w0"))
        await poll_until(lambda: _waiting(clean_db, 1), within=30, what="the first statement")
        fine = asyncio.create_task(_complete(svc, good, "w1"))
        # A result the database refuses (a NUL character has no place in jsonb text).
        broken = asyncio.create_task(
            svc.chained.settle_and_claim(
                LeaseTransition.COMPLETE,
                worker_id="w2",
                key_id=None,
                items=[LeaseUpdate(job_id=bad.id, lease_id=str(bad.lease_id), result="\u0000")],
                ask=ClaimAsk(queues=("default",), max_jobs=1, lease_seconds=30),
            )
        )
        await poll_until(
            lambda: _true(svc.chained.waiting(("default",)) == 2),
            within=30,
            what="both calls waiting for the next statement",
        )
        statements_run.clear()
        await holder.rollback()
    async with asyncio.timeout(30):
        await blocked
        answer: Chained = await fine
        with pytest.raises(asyncpg.UntranslatableCharacterError):
            await broken
    # The shared statement, then each call's own: the good one's, the bad one's, and the bad
    # one's transition on its own (two statements, its claim never reached).
    assert statements_run[:3] == ["job_complete_claim"] * 3, statements_run
    assert [o.ok for o in answer.outcomes] == [True] and len(answer.claimed) == 1
    async with clean_db.connect() as conn:
        status = await conn.scalar(text("SELECT status FROM jobs WHERE id = :id"), {"id": bad.id})
    assert status == "running"


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


async def test_under_limits_concurrent_completes_share_the_limited_statement_within_the_limit(
    clean_db: AsyncEngine, roomy_pool: Any, statements_run: list[str]
) -> None:
    """While limits exist the shared statement is job_complete_claim_limited: its claim keeps
    every key within its limit, and a call whose completion freed a slot its claim could not
    see (one snapshot) claims again after the commit, so each worker gets its next job."""
    svc = service(clean_db, roomy_pool, coalescing=CoalescingPolicy(max_in_flight=2, max_items=100))
    await _limit_keys(svc, max_running=1)
    keys = [f"k{n}" for n in range(4)]
    await svc.jobs.enqueue(
        [NewJob(queue="default", type="t", concurrency_key=k) for k in keys + keys]
    )
    held = {}
    for n, key in enumerate(keys):
        [job] = await svc.jobs.claim(
            worker_id=f"w{n}", queues=["default"], max_jobs=1, lease_seconds=30
        )
        assert job.concurrency_key == key
        held[f"w{n}"] = job
    statements_run.clear()
    async with clean_db.connect() as holder:
        await holder.execute(
            text("SELECT 1 FROM jobs WHERE id = :id FOR UPDATE"), {"id": held["w0"].id}
        )
        blocked = asyncio.create_task(_complete(svc, held["w0"], "w0"))
        await poll_until(lambda: _waiting(clean_db, 1), within=30, what="the first statement")
        calls = {
            worker: asyncio.create_task(_complete(svc, job, worker))
            for worker, job in held.items()
            if worker != "w0"
        }
        await poll_until(
            lambda: _true(svc.chained.waiting(("default",)) == 3),
            within=30,
            what="the other calls waiting for the next statement",
        )
        await holder.rollback()
    async with asyncio.timeout(30):
        answers = {"w0": await blocked} | {w: await task for w, task in calls.items()}
    assert statements_run.count("job_complete_claim_limited") == 2, statements_run
    claimed = {}
    for worker, answer in answers.items():
        assert [o.ok for o in answer.outcomes] == [True], (worker, answer)
        [taken] = answer.claimed
        assert taken.worker_id == worker and answer.claim_error is None
        claimed[taken.id] = taken.concurrency_key
    assert sorted(claimed.values()) == keys, "each key's second job, once"
    async with clean_db.connect() as conn:
        running = dict(
            (
                await conn.execute(
                    text(
                        "SELECT concurrency_key, count(*) FROM jobs WHERE status = 'running' "
                        "GROUP BY 1"
                    )
                )
            ).all()
        )
        slots = dict(
            (
                await conn.execute(
                    text(
                        "SELECT f.key, f.running - COALESCE((SELECT sum(r.n) FROM flow_released r"
                        " WHERE r.key = f.key), 0) FROM flow_state f WHERE f.key LIKE 'key:%'"
                    )
                )
            ).all()
        )
    assert running == dict.fromkeys(keys, 1)
    assert slots == {f"key:default|{k}": 1 for k in keys}


async def test_under_limits_a_claim_waits_for_the_settle_and_claim_on_its_queues(
    clean_db: AsyncEngine, roomy_pool: Any, statements_run: list[str]
) -> None:
    """Under limits a claim and a settle-and-claim on the same queues each lock the key rows of
    the jobs they take and skip those the other holds: side by side both came back short and
    claimed again. One at a time (JobService.limited_lanes), each takes all it asked for in one
    statement, even under a limit that never binds."""
    svc = service(clean_db, roomy_pool, coalescing=CoalescingPolicy(max_in_flight=2, max_items=100))
    await _limit_keys(svc, max_running=100)
    await svc.jobs.enqueue(
        [NewJob(queue="default", type="t", concurrency_key=f"k{n % 2}") for n in range(6)]
    )
    held, other_held = await svc.jobs.claim(
        worker_id="w", queues=["default"], max_jobs=2, lease_seconds=30
    )
    statements_run.clear()
    async with clean_db.connect() as holder:
        await holder.execute(text("SELECT 1 FROM jobs WHERE id = :id FOR UPDATE"), {"id": held.id})
        settling = asyncio.create_task(_complete(svc, held, "w"))
        await poll_until(lambda: _waiting(clean_db, 1), within=30, what="the settle-and-claim")
        claiming = asyncio.create_task(
            svc.jobs.claim(worker_id="c", queues=["default"], max_jobs=2, lease_seconds=30)
        )
        await poll_until(
            lambda: _true(svc.jobs.limited_lanes.users(("default",)) == 2),
            within=30,
            what="the claim waiting for its lane",
        )
        assert statements_run == ["job_complete_claim_limited"], "the claim has not gone out"
        await holder.rollback()
    async with asyncio.timeout(30):
        settled: Chained = await settling
        claimed = await claiming
    assert statements_run == ["job_complete_claim_limited", "job_claim_limited"]
    assert [o.ok for o in settled.outcomes] == [True] and len(settled.claimed) == 1
    assert len(claimed) == 2 and all(job.worker_id == "c" for job in claimed)
    taken = {settled.claimed[0].id, *(job.id for job in claimed)}
    assert len(taken) == 3 and not taken & {held.id, other_held.id}
