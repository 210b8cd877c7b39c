"""Queue operations as units of work: one conditional statement in autocommit, or one transaction.

The API's routes, the dashboard and the maintenance loops call these methods; none of them
touches a store. How a unit of work runs is app/queue/unit.py; the ops reads and admin
actions are app/queue/operations.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from app.domain.records import Job, ReapedJob
from app.domain.states import FINISHED, JobStatus
from app.domain.types import (
    ClaimOutcome,
    ClaimSlot,
    JobEvent,
    LeaseItem,
    LeaseOutcome,
    LeaseTransition,
    NewJob,
)
from app.errors import DatabaseUnavailable, IdempotencyKeyReused, InvalidTransition, NotFound
from app.queue.coalesce import Coalescer
from app.queue.limits import FlowLimits
from app.queue.operations import Operations
from app.queue.results import ResultHub
from app.queue.scheduling import Scheduling
from app.queue.unit import TRANSACTION_TRIES, Announce, Observer, valid_id
from app.queue.waiters import WaiterHub
from app.store import Stores
from app.store.conn import Conn

# While any limit exists, a claim reads this many candidates per slot, so jobs over a limit can
# be skipped for the next eligible ones.
FLOW_WINDOW = 2
# Claim statements one claim may run when limits appeared, or made it skip jobs or create
# flow_state rows.
FLOW_TRIES = 4
# Lease transitions whose repeat with the same lease answers what the first did.
_REPEATABLE = frozenset({LeaseTransition.COMPLETE, LeaseTransition.HEARTBEAT})
# A waiter re-claims this long after a bucket's computed refill, so the token is surely there.
REFILL_SLACK = 0.002


class JobService(Operations, FlowLimits, Scheduling):
    """The queue's operations: enqueue, read, claim, lease transitions, maintenance; and the ops
    reads and actions it inherits (app/queue/operations.py)."""

    def __init__(
        self,
        *,
        engine: AsyncEngine,
        pool: Any,
        stores: Stores,
        max_attempts_default: int,
        lease_seconds_default: int,
        pool_timeout: float = 10.0,
        coalescing: CoalescingPolicy | None = None,
        hub: WaiterHub | None = None,
        results: ResultHub | None = None,
        announce: Announce | None = None,
        bulk_batch_size: int = 1000,
    ) -> None:
        self.engine = engine
        # The asyncpg pool for the hot statements (app/db.py says why there are two).
        self.pool = pool
        self.pool_timeout = pool_timeout
        self.stores = stores
        self.max_attempts_default = max_attempts_default
        self.lease_seconds_default = lease_seconds_default
        self.bulk_batch_size = bulk_batch_size
        # Single-statement work runs in autocommit: one round trip instead of BEGIN, statement,
        # COMMIT. Each statement is atomic on its own; see _run.
        self.autocommit_engine = engine.execution_options(isolation_level="AUTOCOMMIT")
        self.hub = hub or WaiterHub()
        # Parked reads waiting for their job to finish (wait_for_job).
        self.results = results or ResultHub()
        # Called after a commit that made jobs claimable: wakes waiters here and elsewhere.
        self.announce: Announce = announce or self.hub.notify
        # Concurrent requests of one kind share statements (app/queue/coalesce.py); None: off.
        self.coalescing = coalescing
        # Hot statements run, per kind (enqueue, claim, lease_complete ...), for /metrics.
        self.statements: Counter[str] = Counter()
        # Called with the job events of each committed change (metrics, logs); must not block.
        self.observers: list[Observer] = []
        self._leases: dict[LeaseTransition, Coalescer[LeaseItem, LeaseOutcome]] = {}
        self._claims: dict[tuple[str, ...], Coalescer[ClaimSlot, Job | None]] = {}
        self._enqueues: Coalescer[dict[str, Any], tuple[Job, bool] | Exception] | None = None
        # What the last claim said of the limits (app/store/sql/jobs.sql, job_claim): whether
        # any exist, and per set of queues when an empty token bucket refills.
        self._flow_active = False
        self._refill_at: dict[tuple[str, ...], float] = {}
        if coalescing is not None:
            for transition in LeaseTransition:
                self._leases[transition] = self._coalescer(
                    functools.partial(self._lease_statement, transition)
                )
            self._enqueues = self._coalescer(self._enqueue_singles)

    def _coalescer(self, flush: Callable[[Sequence[Any]], Awaitable[Sequence[Any]]]) -> Any:
        if self.coalescing is None:
            raise RuntimeError("coalescing is off")
        return Coalescer(
            flush,
            max_in_flight=self.coalescing.max_in_flight,
            max_items=self.coalescing.max_items,
            shared_errors=(DatabaseUnavailable,),
        )

    # -- producers ---------------------------------------------------------------------------

    def _enqueue_item(self, job: NewJob) -> dict[str, Any]:
        return {
            "queue": job.queue,
            "type": job.type,
            "payload": job.payload,
            "priority": job.priority,
            "max_attempts": job.max_attempts or self.max_attempts_default,
            "lease_seconds": job.lease_seconds or self.lease_seconds_default,
            "timeout_seconds": job.timeout_seconds,
            "run_at": job.run_at.isoformat() if job.run_at is not None else None,
            "delay_seconds": job.delay_seconds,
            "idempotency_key": job.idempotency_key,
            "concurrency_key": job.concurrency_key,
            "idempotency_hash": job.fingerprint if job.idempotency_key is not None else None,
        }

    async def _enqueue_statement(
        self, conn: Conn, items: Sequence[dict[str, Any]], key_field: Callable[[int], str]
    ) -> list[tuple[Job, bool] | Exception]:
        """Inserts the items; answers per item its job and whether it was created, or its error."""
        rows = await self.stores.jobs.job_enqueue(conn, items=items)
        skipped = [i for i, row in enumerate(rows) if row is None]
        existing: Mapping[tuple[str, str], Job] = {}
        if skipped:
            keys = [(items[i]["queue"], items[i]["idempotency_key"]) for i in skipped]
            existing = await self.stores.jobs.job_get_by_idempotency_keys(conn, keys=keys)
        answered: list[tuple[Job, bool] | Exception] = []
        for i, row in enumerate(rows):
            if row is not None:
                answered.append((row, True))
                continue
            key = (items[i]["queue"], items[i]["idempotency_key"])
            found = existing.get(key)
            if found is None:
                # The conflicting job was deleted between the two statements: try again.
                answered.append(_Retry())
            elif found.idempotency_hash != items[i]["idempotency_hash"]:
                answered.append(
                    IdempotencyKeyReused(
                        f"idempotency key {key[1]!r} of queue {key[0]!r} was used for a "
                        "different request",
                        errors=[
                            {
                                "field": key_field(i),
                                "message": "key reused with a different request",
                            }
                        ],
                    )
                )
            else:
                answered.append((found, False))
        self.statements["enqueue"] += 1
        return answered

    def _announce_created(self, answered: Sequence[tuple[Job, bool] | Exception]) -> None:
        """Tells observers of the jobs a committed enqueue created; wakes waiters for the due ones."""
        self._emit(
            [
                JobEvent("enqueued", a[0].id, a[0].queue, status=a[0].status)
                for a in answered
                if isinstance(a, tuple) and a[1]
            ]
        )
        self._announce_counts(
            a[0].queue
            for a in answered
            if isinstance(a, tuple) and a[1] and a[0].status == JobStatus.PENDING
        )

    async def _enqueue_singles(
        self, items: Sequence[dict[str, Any]]
    ) -> Sequence[tuple[Job, bool] | Exception]:
        """One statement for the single enqueues of many requests (each stands alone)."""

        async def work(conn: Conn) -> list[tuple[Job, bool] | Exception]:
            return await self._enqueue_statement(conn, items, lambda _: "idempotency_key")

        answered = await self._run_hot(work)
        self._announce_created(answered)  # after the commit: a woken claim must see the jobs
        return answered

    async def enqueue(
        self, new_jobs: Sequence[NewJob], *, key_field: Callable[[int], str]
    ) -> list[tuple[Job, bool]]:
        """Enqueues jobs, all or nothing; answers each job and whether this call created it.

        A job whose idempotency key exists with the same request is answered as it is; with a
        different request the whole call fails, naming ``key_field(position)``, and nothing is
        written. A single job shares its statement with the single enqueues of other requests
        (coalescing); a batch is one transaction of its own when it carries keys.
        """
        items = [self._enqueue_item(j) for j in new_jobs]
        for _ in range(TRANSACTION_TRIES):
            if len(items) == 1 and self._enqueues is not None:
                [single] = await self._enqueues.submit(items)
                if isinstance(single, _Retry):
                    continue
                if isinstance(single, Exception):
                    raise single
                return [single]
            outcome = await self._enqueue_batch(items, key_field)
            if isinstance(outcome, _Retry):
                continue
            return outcome
        raise InvalidTransition("the idempotency key's job kept being deleted; retry")

    async def _enqueue_batch(
        self, items: Sequence[dict[str, Any]], key_field: Callable[[int], str]
    ) -> list[tuple[Job, bool]] | _Retry:
        any_keys = any(item["idempotency_key"] is not None for item in items)

        async def work(conn: Conn) -> list[tuple[Job, bool]]:
            answered = await self._enqueue_statement(conn, items, key_field)
            for outcome in answered:
                if isinstance(outcome, Exception):
                    raise outcome  # rolls the batch back: all or nothing
            return [a for a in answered if isinstance(a, tuple)]

        try:
            # Keys need the lookup in the same transaction: a reused key rolls the batch back.
            answered = await self._run_hot(work, transaction=any_keys)
        except _Retry as retry:
            return retry
        self._announce_created(answered)  # after the commit: a woken claim must see the jobs
        return answered

    # -- reads -------------------------------------------------------------------------------

    async def get(self, job_id: int) -> Job:
        """One job; ``NotFound`` for unknown or out-of-range ids."""
        if not valid_id(job_id):
            raise NotFound(f"job {job_id} not found")

        async def work(conn: Conn) -> Job | None:
            return await self.stores.jobs.job_get(conn, job_id=job_id)

        row = await self._run_hot(work, idempotent=True)
        if row is None:
            raise NotFound(f"job {job_id} not found")
        return row

    async def ping(self) -> None:
        """Fails when the database does not answer (through the hot path's pool)."""
        await self._run_hot(self.stores.control.health_ping, idempotent=True)

    # -- awaiting a result -------------------------------------------------------------------

    async def wait_for_job(
        self, job_id: int, *, wait_seconds: float, stop: asyncio.Event | None = None
    ) -> Job:
        """One job, once it is finished (succeeded, dead, cancelled) or ``wait_seconds`` passed.

        A job finished already, or ``wait_seconds`` 0, is answered at once; ``NotFound`` for an
        unknown job, and for one deleted while waited for. Otherwise the job is marked awaited
        (one conditional UPDATE, so that its finish notifies ``jobq_finished`` from whichever
        instance finishes it) and the read parks in ``self.results`` holding no database
        connection. Woken by that notification, by the result backstop (which checks every
        parked job once per backstop interval, in case a notification was lost), after a
        reconnect of the control connection, or at shutdown, it re-reads the job and parks
        again while it is unfinished. It answers the job as it is when it finished, when the
        wait ends, when ``stop`` is set (the client went away) or when the instance shuts down.
        """
        if wait_seconds <= 0 or self.results.closed:
            return await self.get(job_id)
        if not valid_id(job_id):
            raise NotFound(f"job {job_id} not found")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_seconds
        stop = stop or asyncio.Event()
        # Parked before the mark: a notification sent once the mark committed must find us.
        waiter = self.results.register(job_id)
        try:
            row = await self._mark_awaited(job_id)
            while row.status not in FINISHED:
                remaining = deadline - loop.time()
                if remaining <= 0 or stop.is_set() or self.results.closed:
                    return row
                await _wait_either(waiter.event, stop, seconds=remaining)
                if stop.is_set():
                    return row  # nobody is listening for the answer
                self.results.rearm(waiter)  # before the read: a later finish wakes us again
                row = await self.get(job_id)
            return row
        finally:
            self.results.unregister(waiter)

    async def _mark_awaited(self, job_id: int) -> Job:
        """The job after marking it awaited, or as found when finished or awaited already."""

        async def work(conn: Conn) -> Job | None:
            row: Job | None = None
            for _ in range(TRANSACTION_TRIES):
                row = await self.stores.jobs.job_await_mark(conn, job_id=job_id)
                if row is not None:
                    return row
                # Finished, awaited already, or unknown: a read in a snapshot of its own (taken
                # after the mark, so it sees any finish the mark waited for) tells which.
                row = await self.stores.jobs.job_get(conn, job_id=job_id)
                if row is None or row.awaited or row.status in FINISHED:
                    return row
                # Retried (finished, then back to pending) between the two statements: again.
            return row  # still moving: park anyway, the backstop has it

        self.statements["await_mark"] += 1
        # Marking twice marks once.
        row = await self._run_hot(work, idempotent=True)
        if row is None:
            raise NotFound(f"job {job_id} not found")
        return row

    async def settled_jobs(self, job_ids: Sequence[int]) -> list[int]:
        """Which of these jobs are finished or gone (the result backstop's check)."""

        async def work(conn: Conn) -> list[int]:
            return await self.stores.jobs.job_await_settled(conn, job_ids=job_ids)

        return await self._run(work)

    # -- workers -----------------------------------------------------------------------------

    async def _claim_slots(
        self, queues: tuple[str, ...], slots: Sequence[ClaimSlot]
    ) -> Sequence[Job | None]:
        """One claim statement for the slots of one or many claim requests on these queues.

        While no limit exists this is the lean claim statement. Once limits exist (the lean one
        then takes nothing and says so) it is job_claim_limited; when that met limited keys or
        queues that have no flow_state row yet, the rows are created (a statement of their own,
        which locks nothing else); when it skipped keys whose rows other transactions held,
        refused jobs over a limit (their rows now say so, and the next statement passes over
        them), or created rows, the slots left empty are claimed again, up to FLOW_TRIES
        statements in all.
        """
        by_slot: list[Job | None] = [None] * len(slots)
        empty = list(range(len(slots)))
        for _ in range(FLOW_TRIES):
            limited = self._flow_active
            asked = [slots[i] for i in empty]

            async def work(
                conn: Conn, asked: list[ClaimSlot] = asked, limited: bool = limited
            ) -> ClaimOutcome:
                if limited:
                    return await self.stores.jobs.job_claim_limited(
                        conn, queues=queues, slots=asked, window=FLOW_WINDOW
                    )
                return await self.stores.jobs.job_claim(conn, queues=queues, slots=asked)

            self.statements["claim"] += 1
            outcome = await self._run_hot(work)
            self._flow_noted(queues, outcome)
            for i, row in zip(empty, outcome.by_slot, strict=True):
                by_slot[i] = row
            empty = [i for i in empty if by_slot[i] is None]
            if not limited and outcome.flow_active:
                continue  # limits appeared: the lean statement took nothing; claim within them
            if outcome.flow_missing:
                missing = outcome.flow_missing

                async def create(conn: Conn, missing: tuple[str, ...] = missing) -> None:
                    await self.stores.flow_limits.flow_state_create(conn, keys=missing)

                await self._run_hot(create)
            elif not outcome.flow_skipped and not outcome.flow_refused:
                break
            if not empty:
                break
        return by_slot

    def _flow_noted(self, queues: tuple[str, ...], outcome: ClaimOutcome) -> None:
        """Keeps what a claim said of the limits: whether any exist, when a token comes back."""
        self._flow_active = outcome.flow_active
        refill = outcome.flow_refill_seconds
        if refill is not None and refill > 0:
            self._refill_at[queues] = asyncio.get_running_loop().time() + refill
        else:
            self._refill_at.pop(queues, None)

    async def _claim_once(
        self,
        *,
        worker_id: str,
        key_id: int | None,
        queues: Sequence[str],
        max_jobs: int,
        lease_seconds: int | None,
    ) -> list[Job]:
        key = tuple(sorted(set(queues)))
        slots = [ClaimSlot(worker_id, key_id, lease_seconds)] * max_jobs
        if self.coalescing is None:
            taken = await self._claim_slots(key, slots)
        else:
            claims = self._claims.get(key)
            if claims is None:
                claims = self._claims[key] = self._coalescer(
                    lambda batch: self._claim_slots(key, batch)
                )
            try:
                taken = await claims.submit(slots)
            finally:
                if claims.idle and self._claims.get(key) is claims:
                    del self._claims[key]
        claimed = [row for row in taken if row is not None]
        self._emit(
            [
                JobEvent(
                    "claimed",
                    row.id,
                    row.queue,
                    status=row.status,
                    worker_id=worker_id,
                    key_id=key_id,
                    attempt=row.attempts,
                    waited_seconds=_waited(row),
                )
                for row in claimed
            ]
        )
        return claimed

    async def claim(
        self,
        *,
        worker_id: str,
        queues: Sequence[str],
        max_jobs: int,
        lease_seconds: int | None,
        wait_seconds: float = 0,
        stop: asyncio.Event | None = None,
        key_id: int | None = None,
    ) -> list[Job]:
        """Leases up to ``max_jobs`` due jobs; with ``wait_seconds``, long-polls until one comes.

        The leases go to ``worker_id`` within the API key ``key_id`` (``None`` without keys):
        lease calls must name both.

        Concurrent claims on the same queues share one claim statement (coalescing); each gets
        its own leases, best jobs to the earliest claim.
        A waiting claim holds no database connection: it parks in the hub and re-runs the claim
        statement when woken: by an announcement, or by the backstop that checks its queues at
        least every second in case an announcement was lost.
        It answers an empty list when the wait ends, when ``stop`` is set (the client went away)
        or when the instance shuts down.
        """

        async def attempt() -> list[Job]:
            return await self._claim_once(
                worker_id=worker_id,
                key_id=key_id,
                queues=queues,
                max_jobs=max_jobs,
                lease_seconds=lease_seconds,
            )

        if wait_seconds <= 0 or self.hub.closed:
            return await attempt()

        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_seconds
        stop = stop or asyncio.Event()
        # Park before the first attempt, so a job announced during it still wakes us.
        waiter = self.hub.register(queues)
        try:
            while True:
                if stop.is_set():
                    return []
                jobs = await attempt()
                if jobs and stop.is_set():
                    # The client left while the claim ran: nobody will get these leases, so
                    # hand the jobs straight back (no attempt charged) instead of letting them
                    # wait out the lease.
                    await self._give_back(worker_id, key_id, jobs)
                    return []
                if jobs:
                    return jobs
                remaining = deadline - loop.time()
                if remaining <= 0 or self.hub.closed:
                    return []
                # Woken by an announcement, by the instance's once-a-second backstop check
                # (app/wakeup/backstop.py), by the client leaving, by the deadline, or when a
                # rate limit's empty bucket gets a token back.
                refill_at = self._refill_at.get(tuple(sorted(set(queues))))
                if refill_at is not None:
                    remaining = min(remaining, max(refill_at - loop.time(), 0.0) + REFILL_SLACK)
                await _wait_either(waiter.event, stop, seconds=remaining)
                if self.hub.closed:
                    return []
                self.hub.rearm(waiter)
        finally:
            self.hub.unregister(waiter)
            if waiter.woken and stop.is_set() and not self.hub.closed:
                # Woken but leaving without claiming: pass the wake-up on to another waiter.
                for queue in waiter.queues:
                    self.hub.notify(queue, 1)

    async def _give_back(self, worker_id: str, key_id: int | None, jobs: Sequence[Job]) -> None:
        items = [{"job_id": j.id, "lease_id": str(j.lease_id)} for j in jobs]
        await self.release(worker_id=worker_id, key_id=key_id, items=items)

    # Each lease call names the worker (its id within the API key ``key_id``, ``None`` without
    # keys); an item whose lease another worker or key holds answers lease_lost.

    async def heartbeat(
        self, *, worker_id: str, items: Sequence[LeaseItem], key_id: int | None = None
    ) -> list[LeaseOutcome]:
        """Extends held leases, saving checkpoint and progress under the ownership check."""
        return await self._lease(LeaseTransition.HEARTBEAT, worker_id, key_id, items)

    async def complete(
        self, *, worker_id: str, items: Sequence[LeaseItem], key_id: int | None = None
    ) -> list[LeaseOutcome]:
        """Completes held jobs; a repeat with the same lease answers the same success."""
        return await self._lease(LeaseTransition.COMPLETE, worker_id, key_id, items)

    async def fail(
        self, *, worker_id: str, items: Sequence[LeaseItem], key_id: int | None = None
    ) -> list[LeaseOutcome]:
        """Fails attempts: retried after a backoff (or ``retry_after_seconds``), or dead."""
        return await self._lease(LeaseTransition.FAIL, worker_id, key_id, items)

    async def release(
        self, *, worker_id: str, items: Sequence[LeaseItem], key_id: int | None = None
    ) -> list[LeaseOutcome]:
        """Gives held jobs back without charging the attempt."""
        return await self._lease(LeaseTransition.RELEASE, worker_id, key_id, items)

    async def _lease(
        self,
        transition: LeaseTransition,
        worker_id: str,
        key_id: int | None,
        items: Sequence[LeaseItem],
    ) -> list[LeaseOutcome]:
        owned = [{**item, "worker_id": worker_id, "key_id": key_id} for item in items]
        coalescer = self._leases.get(transition)
        if coalescer is None:
            return list(await self._lease_statement(transition, owned))
        return list(await coalescer.submit(owned))

    async def _lease_statement(
        self, transition: LeaseTransition, items: Sequence[LeaseItem]
    ) -> Sequence[LeaseOutcome]:
        """Runs a lease transition; items it did not take get a verdict read after it.

        Each item names its worker, so the items may come from many requests. The transition
        is one conditional UPDATE, answering only what it took; that is the whole round trip
        when every lease was held. Items it did not take (a replay, a lost lease, a cancel or a
        timeout) are judged by a second statement, which sees the version of the row the UPDATE
        re-checked after waiting for it: a caller who lost nothing is never told ``lease_lost``
        because of a snapshot taken before the row it waited for was committed.
        """
        statement = {
            LeaseTransition.HEARTBEAT: self.stores.jobs.job_heartbeat,
            LeaseTransition.COMPLETE: self.stores.jobs.job_complete,
            LeaseTransition.FAIL: self.stores.jobs.job_fail,
            LeaseTransition.RELEASE: self.stores.jobs.job_release,
        }[transition]

        async def work(conn: Conn) -> tuple[list[LeaseOutcome], set[int]]:
            taken = await statement(conn, items=items)
            missed = [i for i in range(len(items)) if i not in taken]
            if not missed:
                return [taken[i] for i in range(len(items))], set(taken)
            verdicts = await self.stores.jobs.job_lease_verdict(
                conn, transition=transition, items=[items[i] for i in missed]
            )
            judged = dict(zip(missed, verdicts, strict=True))
            outcomes = [taken[i] if i in taken else judged[i] for i in range(len(items))]
            return outcomes, set(taken)

        self.statements[f"lease_{transition.value}"] += 1
        # A complete or heartbeat sent again with the same lease answers the same success.
        outcomes, changed = await self._run_hot(work, idempotent=transition in _REPEATABLE)
        # A job made claimable, or a running slot given back: a waiting claim may now take one.
        self._announce_counts(
            o.queue
            for i, o in enumerate(outcomes)
            if o.queue and (o.claimable_now or (o.freed_flow and i in changed))
        )
        if transition is not LeaseTransition.HEARTBEAT:
            # Only what this statement changed: a replay's verdict changed nothing.
            self._emit(
                [
                    JobEvent(
                        _lease_event(transition, outcomes[i].status),
                        outcomes[i].job_id,
                        outcomes[i].queue or "",
                        status=outcomes[i].status,
                        worker_id=items[i].get("worker_id"),
                        key_id=items[i].get("key_id"),
                        ran_seconds=outcomes[i].ran_seconds,
                    )
                    for i in sorted(changed)
                ]
            )
        return outcomes

    # -- maintenance -------------------------------------------------------------------------

    async def reap(self, *, batch_size: int, now: datetime | None = None) -> list[ReapedJob]:
        """Returns at most ``batch_size`` expired leases to the queue (or to dead); answers them."""

        async def work(conn: Conn) -> list[ReapedJob]:
            return await self.stores.jobs.job_reap(conn, batch_size=batch_size, now=now)

        reaped = await self._run(work)
        self._emit([JobEvent("reaped", r.id, r.queue, status=r.status) for r in reaped])
        self._announce_counts(r.queue for r in reaped if r.freed_flow)
        return reaped

    async def promote(self, *, batch_size: int, now: datetime | None = None) -> int:
        """Moves at most ``batch_size`` due scheduled jobs to pending and announces them."""

        async def work(conn: Conn) -> Counter[str]:
            return await self.stores.jobs.job_promote(conn, batch_size=batch_size, now=now)

        promoted = await self._run(work)
        for queue, count in promoted.items():
            self.announce(queue, count)
        return sum(promoted.values())

    async def prune(
        self,
        *,
        batch_size: int,
        succeeded_seconds: float,
        cancelled_seconds: float,
        dead_seconds: float,
        now: datetime | None = None,
    ) -> int:
        """Deletes at most ``batch_size`` finished jobs past their retention; answers how many."""

        async def work(conn: Conn) -> int:
            return await self.stores.jobs.job_prune(
                conn,
                batch_size=batch_size,
                succeeded_seconds=succeeded_seconds,
                cancelled_seconds=cancelled_seconds,
                dead_seconds=dead_seconds,
                now=now,
            )

        return await self._run(work)

    async def prune_throughput(
        self, *, keep_seconds: float, batch_size: int, now: datetime | None = None
    ) -> int:
        """Deletes at most ``batch_size`` per-minute outcome rows older than ``keep_seconds``."""

        async def work(conn: Conn) -> int:
            return await self.stores.queues.queue_throughput_prune(
                conn, keep_seconds=keep_seconds, batch_size=batch_size, now=now
            )

        return await self._run(work)

    async def due_in_queues(self, queues: Sequence[str], *, cap: int) -> dict[str, int]:
        """Per unpaused queue, how many jobs are due now (up to ``cap``)."""

        async def work(conn: Conn) -> dict[str, int]:
            return await self.stores.jobs.job_due_in_queues(conn, queues=queues, cap=cap)

        return await self._run(work)


def _waited(row: Job) -> float:
    """Seconds a claimed job was due before its claim, from the row's own (PostgreSQL) times."""
    started = row.started_at or row.run_at  # a claimed row always has started_at
    waited: float = (started - row.run_at).total_seconds()
    return max(waited, 0.0)


def _lease_event(transition: LeaseTransition, status: str | None) -> str:
    """The event of a lease call that changed its job."""
    if transition is LeaseTransition.COMPLETE:
        return "completed"
    if transition is LeaseTransition.RELEASE:
        return "released"
    return "dead" if status == JobStatus.DEAD else "failed"


class _Retry(Exception):
    """Internal: the unit of work must run again."""


@dataclass(frozen=True)
class CoalescingPolicy:
    """How far concurrent requests of one kind are merged into shared statements."""

    max_in_flight: int
    max_items: int


async def _wait_either(first: asyncio.Event, second: asyncio.Event, *, seconds: float) -> None:
    """Waits until either event is set or ``seconds`` pass."""
    waits = [asyncio.ensure_future(first.wait()), asyncio.ensure_future(second.wait())]
    try:
        await asyncio.wait(waits, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in waits:
            task.cancel()
        for task in waits:
            with contextlib.suppress(asyncio.CancelledError):
                await task
