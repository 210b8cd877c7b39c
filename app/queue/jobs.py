"""The hot path: enqueue, read one job, claim (long-polling), and the lease transitions.

Each method is one unit of work (app/store/unit.py): one conditional statement in autocommit,
or one transaction. Concurrent requests of one kind share statements (app/queue/coalesce.py).
After each commit the change is announced through app/queue/events.py. The ops reads and
actions, limits, schedules, awaiting results and the maintenance statements are services of
their own beside this one (app/queue/services.py builds them).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, cast

from app.domain.bounds import valid_id
from app.domain.records import Job, JobHead
from app.domain.states import JobStatus
from app.domain.types import (
    ClaimOutcome,
    ClaimSlot,
    JobDefaults,
    LeaseOutcome,
    LeaseTransition,
    LeaseUpdate,
    NewJob,
    PlainJobs,
    owned_by,
)
from app.errors import DatabaseUnavailable, IdempotencyKeyReused, InvalidTransition, NotFound
from app.queue.coalesce import Coalescer, Lanes
from app.queue.events import Events, claimed_events, lease_events
from app.queue.handoff import split_unreadable, unreadable_failures
from app.queue.linked import ParentReader, ParentResultBounds, Scopes, linked, ordering_keys_of
from app.queue.replays import Retry as _Retry
from app.queue.replays import answer_enqueue
from app.queue.waiters import WaiterHub, wait_either
from app.store import Stores
from app.store.conn import Conn
from app.store.unit import TRANSACTION_TRIES, UnitOfWork

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


@dataclass(frozen=True)
class CoalescingPolicy:
    """How far concurrent requests of one kind are merged into shared statements."""

    max_in_flight: int
    max_items: int


class JobService:
    """The queue's hot path: enqueue, read, claim and the lease transitions."""

    def __init__(
        self,
        *,
        unit: UnitOfWork,
        stores: Stores,
        events: Events,
        hub: WaiterHub,
        defaults: JobDefaults,
        coalescing: CoalescingPolicy | None = None,
        parent_results: ParentResultBounds | None = None,
    ) -> None:
        self.unit = unit
        # What a claimed job that waited for others learns of them (app/queue/linked.py).
        self.parents = ParentReader(
            unit=unit, stores=stores, bounds=parent_results or ParentResultBounds()
        )
        self.stores = stores
        self.events = events
        # Parked (long-polling) claims of this instance.
        self.hub = hub
        self.defaults = defaults
        # Concurrent requests of one kind share statements (app/queue/coalesce.py); None: off.
        self.coalescing = coalescing
        self._leases: dict[LeaseTransition, Coalescer[LeaseUpdate, LeaseOutcome]] = {}
        self._claims: dict[tuple[str, ...], Coalescer[ClaimSlot, Job | None]] = {}
        self._enqueues: Coalescer[NewJob, tuple[Job, bool] | Exception] | None = None
        # What the last claim said of the limits (app/queue/sql/jobs.sql, job_claim): whether
        # any exist, and per set of queues when an empty token bucket refills.
        self.flow_active = False
        self._refill_at: dict[tuple[str, ...], float] = {}
        # Under limits, one claim or settle-and-claim statement at a time per set of queues.
        self.limited_lanes = Lanes()
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

    async def _enqueue_statement(
        self, conn: Conn, jobs: Sequence[NewJob], *, singles: bool, heads: bool = False
    ) -> list[tuple[Job | JobHead, bool] | Exception]:
        """Inserts the jobs; answers per job its row and whether it was created, or its error.

        ``singles``: each job is a call of its own (coalesced single enqueues), so an error
        names position 0; otherwise the jobs are one call's, named by their position.
        ``heads``: a created job is answered by its head only (job_enqueue_ids); a replayed
        one is read whole either way, to compare its request.
        """
        rows: Sequence[Job | JobHead | None] = (
            await self.stores.producers.job_enqueue_ids(conn, jobs=jobs)
            if heads
            else await self.stores.producers.job_enqueue(conn, jobs=jobs)
        )
        skipped = [i for i, row in enumerate(rows) if row is None]
        existing: Mapping[tuple[str, str], Job] = {}
        if skipped:
            keys = [(jobs[i].queue, jobs[i].idempotency_key or "") for i in skipped]
            existing = await self.stores.producers.job_get_by_idempotency_keys(conn, keys=keys)
        answered = answer_enqueue(jobs, rows, existing, singles=singles)
        self.unit.statements["enqueue"] += 1
        return answered

    async def _enqueue_singles(
        self, jobs: Sequence[NewJob]
    ) -> Sequence[tuple[Job, bool] | Exception]:
        """One statement for the single enqueues of many requests (each stands alone)."""

        async for attempt in self.unit.hot():
            async with attempt as conn:
                answered = await self._enqueue_statement(conn, jobs, singles=True)
        # After the commit: a woken claim must see the jobs.
        self.events.created(a[0] for a in answered if isinstance(a, tuple) and a[1])
        return cast(list[tuple[Job, bool] | Exception], answered)  # whole rows: no heads

    async def enqueue(
        self, new_jobs: Sequence[NewJob], *, callback: NewJob | None = None
    ) -> list[tuple[Job, bool]]:
        """:meth:`enqueue_heads` with every job read whole."""
        answered = await self.enqueue_heads(new_jobs, callback=callback, heads=False)
        return cast(list[tuple[Job, bool]], answered)  # heads=False: every row is a whole Job

    async def enqueue_heads(
        self, new_jobs: Sequence[NewJob], *, callback: NewJob | None = None, heads: bool = True
    ) -> list[tuple[Job | JobHead, bool]]:
        """Enqueues jobs, all or nothing; answers each job and whether this call created it.

        A job whose idempotency key exists with the same request is answered as it is; with a
        different request the whole call fails with ``IdempotencyKeyReused`` naming the job's
        position, and nothing is written. A single job shares its statement with the single enqueues of other requests
        (coalescing); a batch is one transaction of its own when it carries keys. A job naming
        parents (``depends_on``) is never coalesced: a parent missing fails its own call only.

        ``callback``: a job enqueued in the same transaction after the others, waiting for all
        of them (its ``on_parent_failure`` says whether it needs them all to succeed); it is
        answered last.

        ``heads``: a job this call created is answered by its head (id, queue, type, status)
        only, for the lean batch answer: the statement returns four columns instead of the
        whole row (job_enqueue_ids). A single coalesced job is read whole either way.
        """
        jobs = [self.defaults.apply(j) for j in new_jobs]
        if callback is not None:
            jobs.append(self.defaults.apply(callback))
        for _ in range(TRANSACTION_TRIES):
            if callback is not None:
                outcome = await self._enqueue_with_callback(jobs, heads=heads)
                if isinstance(outcome, _Retry):
                    continue
                return outcome
            if len(jobs) == 1 and self._enqueues is not None and not linked(jobs[0]):
                [single] = await self._enqueues.submit(jobs)
                if isinstance(single, _Retry):
                    continue
                if isinstance(single, Exception):
                    raise single
                return [single]
            outcome = await self._enqueue_batch(jobs, heads=heads)
            if isinstance(outcome, _Retry):
                continue
            return outcome
        raise InvalidTransition("the idempotency key's job kept being deleted; retry")

    async def enqueue_plain(self, jobs: PlainJobs, *, heads: bool = True) -> list[Job | JobHead]:
        """Enqueues plain jobs in one statement (nothing to replay or lock); answers each."""
        producers = self.stores.producers
        enqueue = producers.job_enqueue_plain if heads else producers.job_enqueue
        async for attempt in self.unit.hot():
            async with attempt as conn:
                rows = await enqueue(conn, jobs=jobs, defaults=self.defaults)
        self.unit.statements["enqueue"] += 1
        created = [row for row in rows if row is not None]  # no key: none is ever skipped
        self.events.created(created)  # after the commit: a woken claim must see the jobs
        return created

    async def _enqueue_with_callback(
        self, jobs: Sequence[NewJob], *, heads: bool
    ) -> list[tuple[Job | JobHead, bool]] | _Retry:
        """The batch, then its callback waiting for every job of it, in one transaction."""
        *batch, callback = jobs
        ordering = ordering_keys_of(batch)
        try:
            async for attempt in self.unit.hot(transaction=True):
                async with attempt as conn:
                    if ordering:
                        await self.stores.workflows.ordering_keys_lock(conn, keys=ordering)
                    outcomes = await self._enqueue_statement(
                        conn, batch, singles=False, heads=heads
                    )
                    for outcome in outcomes:
                        if isinstance(outcome, Exception):
                            raise outcome
                    answered = [a for a in outcomes if isinstance(a, tuple)]
                    parents = tuple(row.id for row, _ in answered)
                    waiting = replace(callback, depends_on=parents)
                    [last] = await self._enqueue_statement(
                        conn, [waiting], singles=False, heads=heads
                    )
                    if isinstance(last, IdempotencyKeyReused):
                        raise IdempotencyKeyReused(last.detail, item=len(batch))
                    if isinstance(last, Exception):
                        raise last
                    answered.append(last)
        except _Retry as retry:
            return retry
        self.events.created(row for row, created in answered if created)
        if ordering:
            await self._unstick(ordering)
        return answered

    async def _enqueue_batch(
        self, jobs: Sequence[NewJob], *, heads: bool
    ) -> list[tuple[Job | JobHead, bool]] | _Retry:
        # A job naming parents runs the insert trigger that locks them: one transaction, so a
        # parent refused (gone since it was checked) rolls the whole call back.
        any_keys = any(job.idempotency_key is not None or linked(job) for job in jobs)
        ordering = ordering_keys_of(jobs)

        try:
            # Keys need the lookup in the same transaction: a reused key rolls the batch back.
            async for attempt in self.unit.hot(transaction=any_keys):
                async with attempt as conn:
                    if ordering:
                        await self.stores.workflows.ordering_keys_lock(conn, keys=ordering)
                    outcomes = await self._enqueue_statement(conn, jobs, singles=False, heads=heads)
                    for outcome in outcomes:
                        if isinstance(outcome, Exception):
                            raise outcome  # rolls the batch back: all or nothing
                    answered = [a for a in outcomes if isinstance(a, tuple)]
        except _Retry as retry:
            return retry
        # After the commit: a woken claim must see the jobs.
        self.events.created(row for row, created in answered if created)
        if ordering:
            await self._unstick(ordering)
        return answered

    async def _unstick(self, keys: Sequence[tuple[str, str]]) -> None:
        """After a keyed enqueue committed: a head that finished while it ran may have missed
        its new waiting job (a finish takes no key lock); makes such a job due."""
        async for attempt in self.unit.hot():
            async with attempt as conn:
                moved = await self.stores.workflows.ordering_key_unstick(conn, keys=keys)
        self.events.wake_queues(queue for _, queue, status in moved if status == JobStatus.PENDING)

    # -- reads -------------------------------------------------------------------------------

    async def get(self, job_id: int) -> Job:
        """One job; ``NotFound`` for unknown or out-of-range ids."""
        if not valid_id(job_id):
            raise NotFound(f"job {job_id} not found")

        async for attempt in self.unit.hot(idempotent=True):
            async with attempt as conn:
                row = await self.stores.jobs.job_get(conn, job_id=job_id)
        if row is None:
            raise NotFound(f"job {job_id} not found")
        return row

    async def ping(self) -> None:
        """Fails when the database does not answer (through the hot path's pool)."""
        async for attempt in self.unit.hot(idempotent=True):
            async with attempt as conn:
                await self.stores.control.health_ping(conn)

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
        statements in all. The last try after skipped keys first waits for their rows, in the same
        transaction: skipping them every time could leave a busy set of keys unclaimed while their
        jobs wait (seen: 16 workers claiming 50 jobs of 20 keys stopped with 1,100 pending).
        """
        by_slot: list[Job | None] = [None] * len(slots)
        empty = list(range(len(slots)))
        held: tuple[str, ...] = ()
        for tries_left in reversed(range(FLOW_TRIES)):
            limited = self.flow_active
            asked = [slots[i] for i in empty]

            self.unit.statements["claim"] += 1
            outcome = await self._claim_statement(queues, asked, limited=limited, held=held)
            # Skipping held rows again is cheaper while tries are left; the last one waits.
            held = outcome.flow_skipped if tries_left == 1 else ()
            self.flow_noted(queues, outcome)
            for i, row in zip(empty, outcome.by_slot, strict=True):
                by_slot[i] = row
            empty = [i for i in empty if by_slot[i] is None]
            if not limited and outcome.flow_active:
                continue  # limits appeared: the lean statement took nothing; claim within them
            if outcome.flow_missing:
                async for attempt in self.unit.hot():
                    async with attempt as conn:
                        await self.stores.flow_limits.flow_state_create(
                            conn, keys=outcome.flow_missing
                        )
            elif not outcome.flow_skipped and not outcome.flow_refused:
                break
            if not empty:
                break
        return by_slot

    async def _claim_statement(
        self,
        queues: tuple[str, ...],
        slots: Sequence[ClaimSlot],
        *,
        limited: bool,
        held: Sequence[str] = (),
    ) -> ClaimOutcome:
        """One claim statement (lean or within limits) in a unit of its own; first waiting for
        the ``held`` flow_state rows in its transaction (its own locks never make it skip)."""
        async with self.limited_lanes.one_at_a_time(queues, when=limited):
            async for attempt in self.unit.hot(transaction=bool(held)):
                async with attempt as conn:
                    if held:
                        await self.stores.flow_limits.flow_state_lock(conn, keys=held)
                    outcome = await self._claim_on(conn, queues, slots, limited=limited)
        return outcome

    async def _claim_on(
        self, conn: Conn, queues: tuple[str, ...], slots: Sequence[ClaimSlot], *, limited: bool
    ) -> ClaimOutcome:
        if limited:
            return await self.stores.jobs.job_claim_limited(
                conn, queues=queues, slots=slots, window=FLOW_WINDOW
            )
        return await self.stores.jobs.job_claim(conn, queues=queues, slots=slots)

    async def claim_in(
        self, conn: Conn, queues: tuple[str, ...], slots: Sequence[ClaimSlot]
    ) -> ClaimOutcome:
        """Claims in the caller's transaction (chained.py): lean, then within limits if any."""
        for limited in (self.flow_active, True):
            self.unit.statements["claim"] += 1
            outcome = await self._claim_on(conn, queues, slots, limited=limited)
            self.flow_noted(queues, outcome)
            if limited or not outcome.flow_active:
                break
        return outcome

    def flow_noted(self, queues: tuple[str, ...], outcome: ClaimOutcome) -> None:
        """Keeps what a claim said of the limits: whether any exist, when a token comes back."""
        self.flow_active = outcome.flow_active
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
        queue_patterns: Scopes,
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
            # Under limits one at a time: a second would skip the key rows the first holds and
            # take nothing (16 x 50 over 20 keys: 29 jobs a statement of 800 slots).
            claims.max_in_flight = 1 if self.flow_active else self.coalescing.max_in_flight
            try:
                taken = await claims.submit(slots)
            finally:
                if claims.idle and self._claims.get(key) is claims:
                    del self._claims[key]
        claimed = [row for row in taken if row is not None]
        return await self.handed(worker_id, key_id, claimed, queue_patterns=queue_patterns)

    async def handed(
        self, worker_id: str, key_id: int | None, claimed: list[Job], *, queue_patterns: Scopes
    ) -> list[Job]:
        """Jobs a committed claim leased, their parents read in as the claiming key's scopes
        ``queue_patterns`` may see them (ParentReader), the claims announced. A job no worker
        could read (app/queue/handoff.py) is failed at once instead."""
        claimed, unreadable = split_unreadable(claimed)
        if any(row.depends_on for row in claimed):
            await self.parents.hand(claimed, queue_patterns=queue_patterns)
        self.events.publish(claimed_events([*claimed, *unreadable], worker_id, key_id))
        if unreadable:
            failures = unreadable_failures(unreadable)
            await self.fail(worker_id=worker_id, key_id=key_id, items=failures)
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
        queue_patterns: Scopes = None,
    ) -> list[Job]:
        """Leases up to ``max_jobs`` due jobs; with ``wait_seconds``, long-polls until one comes.

        The leases go to ``worker_id`` within the API key ``key_id`` (``None`` without keys):
        lease calls must name both; the results of parents come only from ``queue_patterns``.

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
                queue_patterns=queue_patterns,
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
                await wait_either(waiter.event, stop, seconds=remaining)
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
        items = [LeaseUpdate(job_id=j.id, lease_id=str(j.lease_id)) for j in jobs]
        await self.release(worker_id=worker_id, key_id=key_id, items=items)

    # Each lease call names the worker (its id within the API key ``key_id``, ``None`` without
    # keys); an item whose lease another worker or key holds answers lease_lost.

    async def heartbeat(
        self, *, worker_id: str, items: Sequence[LeaseUpdate], key_id: int | None = None
    ) -> list[LeaseOutcome]:
        """Extends held leases, saving checkpoint and progress under the ownership check."""
        return await self._lease(LeaseTransition.HEARTBEAT, worker_id, key_id, items)

    async def complete(
        self, *, worker_id: str, items: Sequence[LeaseUpdate], key_id: int | None = None
    ) -> list[LeaseOutcome]:
        """Completes held jobs; a repeat with the same lease answers the same success."""
        return await self._lease(LeaseTransition.COMPLETE, worker_id, key_id, items)

    async def fail(
        self, *, worker_id: str, items: Sequence[LeaseUpdate], key_id: int | None = None
    ) -> list[LeaseOutcome]:
        """Fails attempts: retried after a backoff (or ``retry_after_seconds``), or dead."""
        return await self._lease(LeaseTransition.FAIL, worker_id, key_id, items)

    async def release(
        self, *, worker_id: str, items: Sequence[LeaseUpdate], key_id: int | None = None
    ) -> list[LeaseOutcome]:
        """Gives held jobs back without charging the attempt."""
        return await self._lease(LeaseTransition.RELEASE, worker_id, key_id, items)

    async def _lease(
        self,
        transition: LeaseTransition,
        worker_id: str,
        key_id: int | None,
        items: Sequence[LeaseUpdate],
    ) -> list[LeaseOutcome]:
        owned = owned_by(items, worker_id, key_id)
        coalescer = self._leases.get(transition)
        if coalescer is None:
            return list(await self._lease_statement(transition, owned))
        return list(await coalescer.submit(owned))

    async def _lease_statement(
        self, transition: LeaseTransition, items: Sequence[LeaseUpdate]
    ) -> Sequence[LeaseOutcome]:
        """Runs a lease transition in a unit of its own, then announces what it changed."""
        # A complete or heartbeat sent again with the same lease answers the same success.
        async for attempt in self.unit.hot(idempotent=transition in _REPEATABLE):
            async with attempt as conn:
                outcomes, changed = await self.lease_in(conn, transition, items)
        self.lease_announce(transition, items, outcomes, changed)
        return outcomes

    async def lease_in(
        self, conn: Conn, transition: LeaseTransition, items: Sequence[LeaseUpdate]
    ) -> tuple[list[LeaseOutcome], set[int]]:
        """Runs a lease transition on ``conn``; answers the outcomes, in order, and the positions
        of the items it changed. Each item names its worker, so the items may come from many
        requests. The transition is one conditional UPDATE, answering only what it took."""
        statement = {
            LeaseTransition.HEARTBEAT: self.stores.jobs.job_heartbeat,
            LeaseTransition.COMPLETE: self.stores.jobs.job_complete,
            LeaseTransition.FAIL: self.stores.jobs.job_fail,
            LeaseTransition.RELEASE: self.stores.jobs.job_release,
        }[transition]
        self.unit.statements[f"lease_{transition.value}"] += 1
        taken = await statement(conn, items=items)
        return await self.judged(conn, transition, items, taken), set(taken)

    async def judged(
        self,
        conn: Conn,
        transition: LeaseTransition,
        items: Sequence[LeaseUpdate],
        taken: dict[int, LeaseOutcome],
    ) -> list[LeaseOutcome]:
        """Each item's outcome: the transition's where it took the item (``taken``), else a verdict
        read after it (a replay, a lost lease, a cancel, a timeout), which sees the row the UPDATE
        re-checked after waiting for it: no ``lease_lost`` from a snapshot older than the row."""
        missed = [i for i in range(len(items)) if i not in taken]
        judged: dict[int, LeaseOutcome] = {}
        if missed:
            verdicts = await self.stores.jobs.job_lease_verdict(
                conn, transition=transition, items=[items[i] for i in missed]
            )
            judged = dict(zip(missed, verdicts, strict=True))
        return [taken[i] if i in taken else judged[i] for i in range(len(items))]

    def lease_announce(
        self,
        transition: LeaseTransition,
        items: Sequence[LeaseUpdate],
        outcomes: Sequence[LeaseOutcome],
        changed: set[int],
    ) -> None:
        """After a committed lease transition: wakes claims for jobs it freed, announces changes."""
        self.events.wake_queues(
            o.queue
            for i, o in enumerate(outcomes)
            if o.queue and (o.claimable_now or (o.freed_flow and i in changed))
        )
        if transition is not LeaseTransition.HEARTBEAT:
            self.events.publish(lease_events(transition, items, outcomes, changed))
