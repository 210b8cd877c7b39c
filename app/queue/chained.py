"""A complete, fail or release that claims the worker's next jobs in the same call (``claim_next``).

One HTTP round trip per job for a worker that settles a job and takes the next one. A call is
one statement, ``job_complete_claim``, ``job_fail_claim`` or ``job_release_claim`` (while limits
exist their ``_limited`` forms, whose claim is ``job_claim_limited``'s): the transition, with
its ownership check and verdicts exactly as on its own, and the claim for the same worker and
key, one round trip and one commit. Lease items a call lost answer ``lease_lost`` as always, and
the claim is made all the same: the worker's slot is free either way.

- **Concurrent calls share it.** Calls of the same transition on the same queues go out in one
  statement (app/queue/coalesce.py): their leases in order, then their claim slots in order
  (best jobs to the earliest call), each call answered with its own verdicts and its own slots.
  The counter triggers are statement-level, so a statement pays them once for all its calls:
  16 workers completing one job each and taking the next took 0.74 transactions a job before
  completes shared it, 0.22 since (``python -m bench``, drain 16 x 1). Under limits one such
  statement or claim runs at a time per set of queues (``JobService.limited_lanes``).
- **One snapshot.** The claim cannot see what the transition did: the slots its completion,
  failure or release freed under a limit, the jobs a fail (``retry_after_seconds`` 0) or a
  release made pending again. A call whose claim came back short claims again after the commit
  in those cases (before fails and releases shared their statement, a claim after the
  transition in the same transaction took a released job back at once, and still does). When
  that claim took nothing and the call may wait (``wait_seconds`` > 0), the call long-polls as
  POST /v1/claim does, through :meth:`JobService.claim`, once the transition has committed: no
  transaction stays open while it waits.
- **When the statement fails**, a shared one runs again for each call on its own (as every
  coalescer does), and a call whose own statement fails runs in one transaction of two
  statements, which tell the transition's error from the claim's. Should the claim statement
  fail there, the transaction rolls back and the transition runs again on its own; the claim's
  error comes back beside the results. A lost connection is the whole call's 503, as for any
  lease call: the client repeats it.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from app.domain.records import Job
from app.domain.states import JobStatus
from app.domain.types import (
    ClaimAsk,
    ClaimOutcome,
    ClaimSlot,
    LeaseOutcome,
    LeaseTransition,
    LeaseUpdate,
    owned_by,
)
from app.errors import DatabaseUnavailable
from app.queue.coalesce import Coalescer
from app.queue.jobs import FLOW_WINDOW, CoalescingPolicy, JobService
from app.store.unit import STATEMENT_REFUSED


@dataclass(frozen=True)
class Chained:
    """What a settle-and-claim call did: the transition's verdicts, then the jobs the claim leased.

    ``claim_error``: the claim failed once the transition had committed (its verdicts stand);
    ``claimed`` then holds what it had leased before failing, usually nothing.
    """

    outcomes: list[LeaseOutcome]
    claimed: list[Job]
    claim_error: Exception | None = None


@dataclass(frozen=True)
class _Call:
    """One settle-and-claim call: the transition of the worker's owned leases, then its ask."""

    transition: LeaseTransition
    worker_id: str
    key_id: int | None
    owned: Sequence[LeaseUpdate]
    ask: ClaimAsk
    stop: asyncio.Event | None
    # The key's scopes as SQL LIKE patterns (None: every queue): whose parents' results it sees.
    queue_patterns: Sequence[str] | None = None


@dataclass(frozen=True)
class _Settled:
    """One call's share of a settle-and-claim statement: the items it took, by position in
    the call's own leases, and what the claim leased to the call's own slots."""

    taken: dict[int, LeaseOutcome]
    outcome: ClaimOutcome
    # Whether the claim was job_claim_limited's (limits existed when the statement went out).
    limited: bool


class ChainedClaims:
    """Runs a complete / fail / release and then a claim for the same worker as one call."""

    def __init__(self, jobs: JobService) -> None:
        self.jobs = jobs
        # Concurrent calls of one transition that claim the same queues share one statement.
        self._settle_claims: dict[
            tuple[LeaseTransition, tuple[str, ...]], Coalescer[_Call, _Settled]
        ] = {}

    def waiting(
        self, queues: tuple[str, ...], transition: LeaseTransition = LeaseTransition.COMPLETE
    ) -> int:
        """Settle-and-claim calls of ``transition`` on ``queues`` waiting for the next shared
        statement."""
        calls = self._settle_claims.get((transition, queues))
        return 0 if calls is None else calls.waiting

    async def settle_and_claim(
        self,
        transition: LeaseTransition,
        *,
        worker_id: str,
        key_id: int | None,
        items: Sequence[LeaseUpdate],
        ask: ClaimAsk,
        stop: asyncio.Event | None = None,
        queue_patterns: Sequence[str] | None = None,
    ) -> Chained:
        """The transition, then a claim of up to ``ask.max_jobs`` jobs for the same worker.

        ``stop`` ends a long-poll when the client went away (jobs it took then go back).
        ``queue_patterns``: as :meth:`JobService.claim` takes them.
        """
        if transition is LeaseTransition.HEARTBEAT:
            raise ValueError("a heartbeat ends no lease: it claims nothing next")
        call = _Call(
            transition,
            worker_id,
            key_id,
            owned_by(items, worker_id, key_id),
            ask,
            stop,
            queue_patterns,
        )
        return await self._run(call)

    async def _alone(self, call: _Call) -> list[LeaseOutcome]:
        """The transition on its own, coalesced with other calls' (JobService)."""
        jobs = self.jobs
        transition: Callable[..., Awaitable[list[LeaseOutcome]]] = {
            LeaseTransition.COMPLETE: jobs.complete,
            LeaseTransition.FAIL: jobs.fail,
            LeaseTransition.RELEASE: jobs.release,
        }[call.transition]
        return await transition(worker_id=call.worker_id, items=call.owned, key_id=call.key_id)

    async def _claim(self, call: _Call, max_jobs: int, wait_seconds: float) -> list[Job]:
        """A claim for the call's worker, through the claims' coalescer (long-polling)."""
        return await self.jobs.claim(
            worker_id=call.worker_id,
            queues=call.ask.queues,
            max_jobs=max_jobs,
            lease_seconds=call.ask.lease_seconds,
            wait_seconds=wait_seconds,
            stop=call.stop,
            key_id=call.key_id,
            queue_patterns=call.queue_patterns,
        )

    async def _run(self, call: _Call) -> Chained:
        """The transition and the claim in one statement (:meth:`_settle_and_claim`), or, when
        that statement was refused, in one transaction of two statements: one commit either
        way; then what the claim could not see, after the commit."""
        jobs = self.jobs
        transition, worker_id, key_id, owned, ask = (
            call.transition,
            call.worker_id,
            call.key_id,
            call.owned,
            call.ask,
        )
        queues = tuple(sorted(set(ask.queues)))
        slots = [ClaimSlot(worker_id, key_id, ask.lease_seconds)] * ask.max_jobs
        limited = False
        settled = await self._settle_and_claim(call, queues)
        if settled is not None:
            outcomes, changed, outcome, limited = settled
        else:
            claiming = False
            try:
                # Not idempotent: a repeat after a commit whose answer was lost would claim again.
                async for attempt in jobs.unit.hot(transaction=True):
                    async with attempt as conn:
                        claiming = False
                        outcomes, changed = await jobs.lease_in(conn, transition, owned)
                        claiming = True
                        outcome = await jobs.claim_in(conn, queues, slots)
            except Exception as error:  # the claim's own error is answered beside the transition
                if not claiming or isinstance(error, DatabaseUnavailable):
                    raise  # the transition's own error, or a commit of unknown fate: as today
                # Rolled back, transition and all: the transition alone, as without claim_next.
                return Chained(await self._alone(call), [], error)
        jobs.lease_announce(transition, owned, outcomes, changed)
        claimed: list[Job] = []
        try:
            taken = [row for row in outcome.by_slot if row is not None]
            claimed = await jobs.handed(
                worker_id, key_id, taken, queue_patterns=call.queue_patterns
            )
            limits_again = bool(
                outcome.flow_missing
                or outcome.flow_skipped
                or outcome.flow_refused
                # A limit appeared: the plain statement took nothing; the limited claim is next.
                or (settled is not None and not limited and outcome.flow_active)
                # The slots its transition freed were not its claim's to see (one snapshot):
                # a claim after the commit can take them.
                or (limited and any(o.freed_flow for o in outcomes))
            )
            # Nor the jobs its fail or release made pending again: with slots left, a claim
            # after the commit may take them (as one after the transition in its transaction).
            made_pending = settled is not None and any(
                o.status == JobStatus.PENDING.value for o in outcomes
            )
            wanted = ask.max_jobs - len(claimed)
            if wanted and (limits_again or made_pending or (not claimed and ask.wait_seconds > 0)):
                # A claim that has jobs answers at once, as POST /v1/claim does.
                claimed += await self._claim(call, wanted, 0 if claimed else ask.wait_seconds)
        except Exception as error:  # noqa: BLE001 - the transition committed; its verdicts stand
            return Chained(outcomes, claimed, error)
        return Chained(outcomes, claimed)

    async def _settle_and_claim(
        self, call: _Call, queues: tuple[str, ...]
    ) -> tuple[list[LeaseOutcome], set[int], ClaimOutcome, bool] | None:
        """The transition and a claim as one statement (job_complete_claim, job_fail_claim or
        job_release_claim; while limits exist their _limited forms, and the answer's last item
        says so): one round trip and one commit, where a transaction of two statements makes
        four round trips; concurrent calls of the same transition on the same queues share it.
        ``None`` when the statement failed (alone: a shared one that fails runs again for each
        call on its own): it changed nothing (a statement is atomic), and the call runs as two
        statements, which tell the transition's error from the claim's."""
        jobs = self.jobs
        try:
            if jobs.coalescing is None:
                (settled,) = await self._settle_claim_statement(call.transition, queues, [call])
            else:
                settled = await self._submit_settle_claim(queues, call, jobs.coalescing)
        except STATEMENT_REFUSED:
            return None
        taken, outcome = settled.taken, settled.outcome
        outcomes = [taken[i] for i in sorted(taken)]
        if len(taken) < len(call.owned):
            # Items not taken are judged after the commit, from the rows as they are now, as
            # after a transition that waited for them.
            async for attempt in jobs.unit.hot(idempotent=True):
                async with attempt as conn:
                    outcomes = await jobs.judged(conn, call.transition, call.owned, taken)
        return outcomes, set(taken), outcome, settled.limited

    async def _submit_settle_claim(
        self, queues: tuple[str, ...], call: _Call, coalescing: CoalescingPolicy
    ) -> _Settled:
        """The call's share of a settle-and-claim statement shared with concurrent calls of the
        same transition on ``queues``."""
        key = (call.transition, queues)
        calls = self._settle_claims.get(key)
        if calls is None:
            calls = self._settle_claims[key] = Coalescer(
                lambda batch: self._settle_claim_statement(call.transition, queues, batch),
                max_in_flight=coalescing.max_in_flight,
                # coalesce_max_items counts rows: a call brings its leases and its claim slots.
                max_items=coalescing.max_items,
                shared_errors=(DatabaseUnavailable,),
                weight=lambda shared: len(shared.owned) + shared.ask.max_jobs,
            )
        # Under limits one at a time, as the claims (JobService): a second would skip the
        # limited rows the first holds and take nothing.
        calls.max_in_flight = 1 if self.jobs.flow_active else coalescing.max_in_flight
        try:
            (settled,) = await calls.submit([call])
        finally:
            if calls.idle and self._settle_claims.get(key) is calls:
                del self._settle_claims[key]
        return settled

    async def _settle_claim_statement(
        self, transition: LeaseTransition, queues: tuple[str, ...], calls: Sequence[_Call]
    ) -> list[_Settled]:
        """One settle-and-claim statement for ``calls``: their leases in order, then their claim
        slots in order (each call's ``max_jobs``, best jobs to the earliest call); answers each
        call's share."""
        jobs = self.jobs
        items = [item for call in calls for item in call.owned]
        slots = [
            ClaimSlot(call.worker_id, call.key_id, call.ask.lease_seconds)
            for call in calls
            for _ in range(call.ask.max_jobs)
        ]
        limited = jobs.flow_active
        store = jobs.stores.jobs
        plain, within_limits = {
            LeaseTransition.COMPLETE: (store.job_complete_claim, store.job_complete_claim_limited),
            LeaseTransition.FAIL: (store.job_fail_claim, store.job_fail_claim_limited),
            LeaseTransition.RELEASE: (store.job_release_claim, store.job_release_claim_limited),
        }[transition]
        # Under limits, not beside a claim on the same queues (JobService.limited_lanes).
        async with jobs.limited_lanes.one_at_a_time(queues, when=limited):
            # Not idempotent: a repeat after a commit whose answer was lost would claim again.
            async for attempt in jobs.unit.hot():
                async with attempt as conn:
                    if limited:
                        taken, outcome = await within_limits(
                            conn, items=items, queues=queues, slots=slots, window=FLOW_WINDOW
                        )
                    else:
                        taken, outcome = await plain(conn, items=items, queues=queues, slots=slots)
        jobs.unit.statements[f"lease_{transition.value}"] += 1
        jobs.unit.statements["claim"] += 1
        jobs.flow_noted(queues, outcome)
        shares: list[_Settled] = []
        first_item = first_slot = 0
        for call in calls:
            last_item, last_slot = first_item + len(call.owned), first_slot + call.ask.max_jobs
            shares.append(
                _Settled(
                    taken={
                        position - first_item: verdict
                        for position, verdict in taken.items()
                        if first_item <= position < last_item
                    },
                    outcome=dataclasses.replace(
                        outcome, by_slot=outcome.by_slot[first_slot:last_slot]
                    ),
                    limited=limited,
                )
            )
            first_item, first_slot = last_item, last_slot
        return shares
