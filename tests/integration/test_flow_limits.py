"""Concurrency limits under concurrent claims and releases on committed rows; flow_state upkeep."""

from __future__ import annotations

import asyncio
import contextlib
import random
from dataclasses import replace
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.domain.types import ClaimSlot, LeaseUpdate
from app.queue.jobs import FLOW_WINDOW, CoalescingPolicy
from app.queue.services import Services
from tests.integration.helpers import seed_jobs, service
from tests.locks import lock_waiters
from tests.polling import poll_until

KEYS = 4
MAX_RUNNING = 3


async def limit(engine: AsyncEngine, pattern: str, **columns: Any) -> None:
    like = pattern.replace("*", "%")
    names = ", ".join(columns)
    binds = ", ".join(f":{k}" for k in columns)
    async with engine.begin() as conn:
        await conn.execute(
            text(
                f"INSERT INTO flow_limits (scope, pattern, like_pattern, {names}) "
                f"VALUES ('key', :pattern, :like, {binds})"
            ),
            {"pattern": pattern, "like": like, **columns},
        )


async def running_per_key(engine: AsyncEngine) -> dict[str, int]:
    async with engine.connect() as conn:
        rows = await conn.execute(
            text(
                "SELECT concurrency_key, count(*) FROM jobs WHERE status = 'running' "
                "AND concurrency_key IS NOT NULL GROUP BY 1"
            )
        )
        return {k: int(n) for k, n in rows}


async def test_concurrent_claims_and_releases_never_exceed_a_limit(
    clean_db: AsyncEngine, svc: Services
) -> None:
    await limit(clean_db, "k*", max_running=MAX_RUNNING)
    for key in range(KEYS):
        await seed_jobs(clean_db, 100, concurrency_key=f"k{key}")
    total = 100 * KEYS
    finished: list[int] = []
    highest = 0
    rng = random.Random(7)
    done = asyncio.Event()

    async def worker(n: int) -> None:
        while len(finished) < total:
            # A full key's jobs wait: the claim parks until a release announces a free slot.
            rows = await svc.jobs.claim(
                worker_id=f"w{n}",
                queues=["default"],
                max_jobs=2,
                lease_seconds=30,
                wait_seconds=0.5,
            )
            if not rows:
                continue
            items = [LeaseUpdate(job_id=r.id, lease_id=str(r.lease_id)) for r in rows]
            outcome = rng.choice(("complete", "complete", "fail", "release"))
            if outcome == "complete":
                await svc.jobs.complete(worker_id=f"w{n}", items=items)
                finished.extend(r.id for r in rows)
            elif outcome == "fail":
                failed = [
                    replace(i, error="x", retryable=True, retry_after_seconds=0) for i in items
                ]
                await svc.jobs.fail(worker_id=f"w{n}", items=failed)
            else:
                await svc.jobs.release(worker_id=f"w{n}", items=items)

    async def sample() -> None:
        nonlocal highest
        while not done.is_set():
            counts = await running_per_key(clean_db)
            highest = max([highest, *counts.values()])
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(done.wait(), 0.005)

    sampler = asyncio.create_task(sample())
    try:
        async with asyncio.timeout(120):
            await asyncio.gather(*(worker(n) for n in range(12)))
    finally:
        done.set()
        await sampler
    assert highest <= MAX_RUNNING
    assert highest == MAX_RUNNING, "the limit was reached, so it was tested"
    async with clean_db.connect() as conn:
        held = dict((await conn.execute(text("SELECT key, running FROM flow_running"))).all())
    assert held == {f"key:default|k{k}": 0 for k in range(KEYS)}


async def test_deleting_or_truncating_running_jobs_gives_their_slots_back(
    clean_db: AsyncEngine, svc: Services
) -> None:
    await limit(clean_db, "k", max_running=5)
    await seed_jobs(clean_db, 4, concurrency_key="k")
    rows = await svc.jobs.claim(worker_id="w", queues=["default"], max_jobs=4, lease_seconds=30)
    assert len(rows) == 4
    async with clean_db.begin() as conn:
        assert (
            await conn.scalar(text("SELECT running FROM flow_running WHERE key = 'key:default|k'"))
            == 4
        )
        await conn.execute(text("DELETE FROM jobs WHERE id = :id"), {"id": rows[0].id})
        assert (
            await conn.scalar(text("SELECT running FROM flow_running WHERE key = 'key:default|k'"))
            == 3
        )
        await conn.execute(text("TRUNCATE jobs"))
        assert await conn.scalar(text("SELECT count(*) FROM flow_state")) == 0


async def test_the_pruner_deletes_idle_flow_rows_only(clean_db: AsyncEngine, svc: Services) -> None:
    await limit(clean_db, "k*", max_running=5)
    await seed_jobs(clean_db, 1, concurrency_key="k1")
    await seed_jobs(clean_db, 1, concurrency_key="k2")
    rows = await svc.jobs.claim(worker_id="w", queues=["default"], max_jobs=2, lease_seconds=30)
    assert len(rows) == 2
    done = next(r for r in rows if r.concurrency_key == "k1")
    await svc.jobs.complete(
        worker_id="w", items=[LeaseUpdate(job_id=done.id, lease_id=str(done.lease_id))]
    )
    async with clean_db.connect() as conn:
        later = await conn.scalar(text("SELECT now() + interval '1 hour'"))
    # Now: both rows were touched within the idle time; an hour on, only k1's is idle (k2 runs).
    assert await svc.limits.prune_state(batch_size=10) == 0
    assert await svc.limits.prune_state(batch_size=10, now=later) == 1
    async with clean_db.connect() as conn:
        keys = [k for (k,) in await conn.execute(text("SELECT key FROM flow_state"))]
    assert keys == ["key:default|k2"]
    # A claim that needs the pruned row again creates it and claims in the same call.
    await seed_jobs(clean_db, 1, concurrency_key="k1")
    [again] = await svc.jobs.claim(worker_id="w", queues=["default"], max_jobs=1, lease_seconds=30)
    assert again.concurrency_key == "k1"


async def test_a_rate_limit_refills_from_the_database_clock(
    clean_db: AsyncEngine, svc: Services
) -> None:
    await limit(clean_db, "r", rate_limit=2, rate_per_seconds=3600.0)
    await seed_jobs(clean_db, 5, concurrency_key="r")
    assert (
        len(await svc.jobs.claim(worker_id="w", queues=["default"], max_jobs=5, lease_seconds=30))
        == 2
    )
    assert (
        await svc.jobs.claim(worker_id="w", queues=["default"], max_jobs=5, lease_seconds=30) == []
    )
    # Half an hour of the bucket's clock later, one token is back.
    async with clean_db.begin() as conn:
        await conn.execute(
            text(
                "UPDATE flow_state SET refilled_at = refilled_at - interval '30 minutes', "
                "blocked_until = blocked_until - interval '30 minutes'"
            )
        )
    assert (
        len(await svc.jobs.claim(worker_id="w", queues=["default"], max_jobs=5, lease_seconds=30))
        == 1
    )


async def wait_for_lock_waiter(engine: AsyncEngine) -> None:
    """Polls until some backend waits on a heavyweight lock (a row lock's transaction)."""

    async def waiting() -> bool:
        async with engine.connect() as conn:
            return bool(
                await conn.scalar(
                    text(
                        "SELECT EXISTS (SELECT 1 FROM pg_stat_activity "
                        "WHERE wait_event_type = 'Lock' AND datname = current_database())"
                    )
                )
            )

    await poll_until(waiting, within=30, what="a claim waiting for the held key row")


async def test_a_release_gives_slots_back_without_waiting_for_the_key_row(
    clean_db: AsyncEngine, svc: Services
) -> None:
    await limit(clean_db, "k", max_running=5)
    await seed_jobs(clean_db, 3, concurrency_key="k")
    rows = await svc.jobs.claim(worker_id="w", queues=["default"], max_jobs=3, lease_seconds=30)
    assert len(rows) == 3
    async with clean_db.connect() as holder:
        # Another transaction (a claim, say) holds the key's row until its commit.
        await holder.execute(
            text("SELECT 1 FROM flow_state WHERE key = 'key:default|k' FOR UPDATE")
        )
        # Completes no longer lock the row: they append to the journal and answer at once.
        async with asyncio.timeout(10):
            verdicts = await svc.jobs.complete(
                worker_id="w",
                items=[LeaseUpdate(job_id=r.id, lease_id=str(r.lease_id)) for r in rows[:2]],
            )
        assert [v.ok for v in verdicts] == [True, True]
        await holder.rollback()
    async with clean_db.connect() as conn:
        state = (
            await conn.execute(
                text(
                    "SELECT f.running, v.running, (SELECT sum(n) FROM flow_released) "
                    "FROM flow_state f JOIN flow_running v USING (key)"
                )
            )
        ).one()
    assert tuple(state) == (3, 1, 2), "the row still counts 3, the journal gives 2 back"
    # The next claim that locks the row folds the journal into it, then counts from there.
    await seed_jobs(clean_db, 1, concurrency_key="k")
    [more] = await svc.jobs.claim(worker_id="w", queues=["default"], max_jobs=1, lease_seconds=30)
    assert more.concurrency_key == "k"
    async with clean_db.connect() as conn:
        running = await conn.scalar(text("SELECT running FROM flow_state"))
        journal = await conn.scalar(text("SELECT count(*) FROM flow_released"))
    assert (running, journal) == (2, 0)


async def test_a_claim_again_waits_for_key_rows_others_hold_instead_of_giving_up(
    clean_db: AsyncEngine, svc: Services
) -> None:
    await limit(clean_db, "k", max_running=5)
    await seed_jobs(clean_db, 1, concurrency_key="other")
    await seed_jobs(clean_db, 1, concurrency_key="k")
    # Make the key's row exist, then hold it as a concurrent claim would.
    first = await svc.jobs.claim(worker_id="w", queues=["default"], max_jobs=1, lease_seconds=30)
    assert [r.concurrency_key for r in first] == ["other"], "no limit on 'other': taken first"
    async with clean_db.connect() as setup:
        await setup.execute(
            text("INSERT INTO flow_state (key) VALUES ('key:default|k') ON CONFLICT DO NOTHING")
        )
        await setup.commit()
    async with clean_db.connect() as holder:
        await holder.execute(
            text("SELECT 1 FROM flow_state WHERE key = 'key:default|k' FOR UPDATE")
        )
        claim = asyncio.create_task(
            svc.jobs.claim(worker_id="w", queues=["default"], max_jobs=1, lease_seconds=30)
        )
        # The first statement skips the held row; the claim again waits for it.
        await wait_for_lock_waiter(clean_db)
        assert not claim.done()
        await holder.commit()
    async with asyncio.timeout(30):
        [taken] = await claim
    assert taken.concurrency_key == "k"


async def test_under_limits_an_instance_runs_one_claim_of_its_queues_at_a_time(
    clean_db: AsyncEngine, driver_pool: Any
) -> None:
    """Two claim statements of the same queues would contend for the same flow_state rows (the
    second skips the keys the first holds and takes nothing), so under limits the claims of an
    instance take turns: the later ones wait in the coalescer and share the next statement."""
    svc = service(
        clean_db, driver_pool, coalescing=CoalescingPolicy(max_in_flight=2, max_items=100)
    )
    async with clean_db.begin() as conn:
        await conn.execute(
            text(
                "INSERT INTO flow_limits (scope, pattern, like_pattern, max_running) "
                "VALUES ('queue', 'default', 'default', 100)"
            )
        )
    await seed_jobs(clean_db, 4)
    [first] = await svc.jobs.claim(worker_id="w", queues=["default"], max_jobs=1, lease_seconds=30)
    assert first.flow_keys == ["queue:default"]
    async with clean_db.connect() as holder:
        # Another instance's claim holds the queue's row: this instance's claim waits for it.
        await holder.execute(
            text("SELECT 1 FROM flow_state WHERE key = 'queue:default' FOR UPDATE")
        )
        ask: dict[str, Any] = {"queues": ["default"], "max_jobs": 1, "lease_seconds": 30}
        waiting = asyncio.create_task(svc.jobs.claim(worker_id="a", **ask))
        await wait_for_lock_waiter(clean_db)
        later = [asyncio.create_task(svc.jobs.claim(worker_id=worker, **ask)) for worker in "bc"]
        claims = svc.jobs._claims[("default",)]
        await poll_until(
            lambda: claims.waiting == 2, within=30, what="the later claims waiting their turn"
        )
        assert await lock_waiters(clean_db) == 1, "one claim statement of the queue at a time"
        await holder.rollback()
    async with asyncio.timeout(30):
        taken = [await waiting, *[await task for task in later]]
    assert [len(rows) for rows in taken] == [1, 1, 1]
    assert len({rows[0].id for rows in taken} | {first.id}) == 4


async def test_a_claim_that_waited_for_a_row_folds_the_slots_given_back_into_its_newest_count(
    clean_db: AsyncEngine, svc: Services
) -> None:
    """A claim that waits for a queue's row locks its newest version, newer than the one its
    snapshot sees once the claim holding it commits. Its write-back was judged from the older
    one: after folding a slot given back, the row looked unchanged and was left unwritten, the
    journal row gone, and the queue counted one job more than ran, for good (found by a
    two-instance stress: a few keys of 20 leaked a slot in most runs of 2,000 jobs)."""
    async with clean_db.begin() as conn:
        await conn.execute(
            text(
                "INSERT INTO flow_limits (scope, pattern, like_pattern, max_running) "
                "VALUES ('queue', 'default', 'default', 3), ('key', 'k*', 'k%', 5)"
            )
        )
    [ending] = await seed_jobs(clean_db, 1, concurrency_key="kC")
    [taken] = await svc.jobs.claim(worker_id="w", queues=["default"], max_jobs=1, lease_seconds=30)
    assert taken.id == ending
    [other] = await seed_jobs(clean_db, 1, concurrency_key="kB")
    # The other claim locks its slot's window of candidates: this one gets the one after.
    await seed_jobs(clean_db, FLOW_WINDOW, concurrency_key="kD")
    async with clean_db.begin() as conn:
        await conn.execute(
            text("INSERT INTO flow_state (key) VALUES ('key:default|kB'), ('key:default|kD')")
        )
    slot = [ClaimSlot("t", None, 30)]

    async def claim_alone() -> list[int]:
        """One claim statement in a transaction of its own (no claim again)."""
        async for attempt in svc.unit.hot(transaction=True):
            async with attempt as conn:
                outcome = await svc.jobs.claim_in(conn, ("default",), slot)
        return [row.id for row in outcome.by_slot if row is not None]

    async with clean_db.connect() as holder:
        # kD's row is held throughout: the waiting claim passes over its only candidate.
        await holder.execute(
            text("SELECT 1 FROM flow_state WHERE key = 'key:default|kD' FOR UPDATE")
        )
        async for attempt in svc.unit.hot(transaction=True):
            async with attempt as conn:
                # Another claim takes a job and holds the queue's row until it commits.
                outcome = await svc.jobs.claim_in(conn, ("default",), slot)
                assert [row.id for row in outcome.by_slot if row is not None] == [other]
                # Meanwhile a job of the queue ends: its slot goes back through the journal.
                [verdict] = await svc.jobs.complete(
                    worker_id="w",
                    items=[LeaseUpdate(job_id=taken.id, lease_id=str(taken.lease_id))],
                )
                assert verdict.ok
                # This claim waits for the queue's row; its snapshot predates the other's commit.
                waiting = asyncio.create_task(claim_alone())
                await wait_for_lock_waiter(clean_db)
        async with asyncio.timeout(30):
            assert await waiting == [], "its only candidate's key row was held"
        await holder.rollback()
    async with clean_db.connect() as conn:
        counted = await conn.scalar(
            text("SELECT running FROM flow_running WHERE key = 'queue:default'")
        )
        running = await conn.scalar(text("SELECT count(*) FROM jobs WHERE status = 'running'"))
    assert running == 1
    assert counted == running, "the slot given back was folded into the newest count"
