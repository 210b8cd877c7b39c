"""A complete, fail or release that claims the worker's next jobs in the same call (``claim_next``).

One HTTP round trip per job for a worker that settles a job and takes the next one. A call
runs one of three ways:

- **A complete** is one statement, ``job_complete_claim`` (while limits exist
  ``job_complete_claim_limited``, whose claim is ``job_claim_limited``'s): the completion and
  the claim, one round trip and one commit. Concurrent calls on the same queues
  share it (app/queue/coalesce.py): their leases in order, then their claim slots in order
  (best jobs to the earliest call), each call answered with its own verdicts and its own
  slots. Under limits one such statement runs at a time, as claims do (JobService), and the
  slots its completion frees are not its claim's (one snapshot): a call with empty slots whose
  completion freed limited slots, or whose claim a limit refused, claims again after the
  commit. The counter triggers
  are statement-level, so a statement pays them once for all its
  calls: 16 workers completing one job each and taking the next took 0.74 transactions a job
  before they shared it, 0.22 since (``python -m bench``, drain 16 x 1). Should the statement
  fail, each call runs it again on its own, and a call whose own statement fails runs as
  below, in one transaction of two statements, which tell the transition's error from the
  claim's.
- **In one transaction**, a fail or a release while few
  such calls run in the instance (``SHARED_FROM_RUNNING``): the transition first, with its
  ownership check and verdicts exactly as on its own (:meth:`JobService.lease_in`), then the
  claim for the same worker and key, one commit for both. Lease items a call lost answer
  ``lease_lost`` as always, and the claim is made all the same: the worker's slot is free
  either way. When that claim took nothing and the call may wait (``wait_seconds`` > 0), the
  call long-polls as POST /v1/claim does, through :meth:`JobService.claim`, once the
  transition has committed: no transaction stays open while it waits. The same happens,
  without waiting, when the claim met limit rows it could not use in the transaction
  (missing, held by others, or refusing), as POST /v1/claim claims again in those cases.
  Should the claim statement fail, the transaction rolls back and the transition runs again
  on its own; the claim's error comes back beside the results. A lost connection is the
  whole call's 503, as for any lease call: the client repeats it.
- **Through the coalescers**, when more run: the transition goes out with the other lease
  calls' and commits, then the claim with the other claims (app/queue/coalesce.py). Many
  workers' transactions of their own each pay a commit; shared statements pay one for all.
  Under limits a claim also holds its keys' flow_state rows until it commits: claims in many
  workers' own transactions took turns on them (those finding them held took nothing), where
  the instance's claims of a set of queues run one statement at a time (JobService). A slot a
  limit frees then goes to the best claim of that statement, not necessarily to the call that
  freed it.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from app.domain.records import Job
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

# Other settle-and-claim calls running in the instance from which a call goes through the
# coalescers. With fewer, a shared statement carries one or two calls, and each pays two
# commits where its own transaction pays one. Measured with the in-repo bench, 3,000 jobs,
# 3 rounds, jobq ÷ lean raw SQL (own transaction always / shared from 1 / shared from 4):
# 4 workers x 1 job 0.29 / 0.22 / 0.27, 16 x 1 0.28 / 0.44 / 0.44, 16 x 50 0.41 / 0.53 / 0.56;
# with 20 concurrency keys under a limit, 16 x 1 went from 427 to 1,407 jobs/s shared.
SHARED_FROM_RUNNING = 4


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


@dataclass(frozen=True)
class _Settled:
    """One call's share of a job_complete_claim statement: the items it took, by position in
    the call's own leases, and what the claim leased to the call's own slots."""

    taken: dict[int, LeaseOutcome]
    outcome: ClaimOutcome
    # Whether the claim was job_claim_limited's (limits existed when the statement went out).
    limited: bool


class ChainedClaims:
    """Runs a complete / fail / release and then a claim for the same worker as one call."""

    def __init__(self, jobs: JobService) -> None:
        self.jobs = jobs
        # Settle-and-claim calls of this instance running now.
        self._running = 0
        # Concurrent completes that claim the same queues share one job_complete_claim.
        self._complete_claims: dict[tuple[str, ...], Coalescer[_Call, _Settled]] = {}

    def waiting(self, queues: tuple[str, ...]) -> int:
        """Complete-and-claim calls on ``queues`` waiting for the next shared statement."""
        calls = self._complete_claims.get(queues)
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
    ) -> Chained:
        """The transition, then a claim of up to ``ask.max_jobs`` jobs for the same worker.

        ``stop`` ends a long-poll when the client went away (jobs it took then go back).
        """
        if transition is LeaseTransition.HEARTBEAT:
            raise ValueError("a heartbeat ends no lease: it claims nothing next")
        call = _Call(transition, worker_id, key_id, owned_by(items, worker_id, key_id), ask, stop)
        # A complete shares its one statement with concurrent calls' (_complete_and_claim): the
        # transaction of its own is that statement.
        one_statement = transition is LeaseTransition.COMPLETE
        shared = not one_statement and self._running >= SHARED_FROM_RUNNING
        self._running += 1
        try:
            if shared:
                return await self._coalesced(call)
            return await self._in_one_transaction(call)
        finally:
            self._running -= 1

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
        )

    async def _coalesced(self, call: _Call) -> Chained:
        """The transition through its coalescer, committed, then the claim through the claims'
        coalescer: statements and commits shared with the instance's other calls."""
        outcomes = await self._alone(call)
        try:
            claimed = await self._claim(call, call.ask.max_jobs, call.ask.wait_seconds)
        except Exception as error:  # noqa: BLE001 - the transition committed; its verdicts stand
            return Chained(outcomes, [], error)
        return Chained(outcomes, claimed)

    async def _in_one_transaction(self, call: _Call) -> Chained:
        """The transition and the claim in one transaction of their own: one commit."""
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
        settled, limited = None, False
        if transition is LeaseTransition.COMPLETE:
            settled = await self._complete_and_claim(call, queues)
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
            claimed = await jobs.handed(worker_id, key_id, taken)
            limits_again = bool(
                outcome.flow_missing
                or outcome.flow_skipped
                or outcome.flow_refused
                # A limit appeared: job_complete_claim took nothing; the limited claim is next.
                or (settled is not None and not limited and outcome.flow_active)
                # The slots its completion freed were not its claim's to see (one snapshot):
                # a claim after the commit can take them.
                or (limited and any(o.freed_flow for o in outcomes))
            )
            wanted = ask.max_jobs - len(claimed)
            if wanted and (limits_again or (not claimed and ask.wait_seconds > 0)):
                # A claim that has jobs answers at once, as POST /v1/claim does.
                claimed += await self._claim(call, wanted, 0 if claimed else ask.wait_seconds)
        except Exception as error:  # noqa: BLE001 - the transition committed; its verdicts stand
            return Chained(outcomes, claimed, error)
        return Chained(outcomes, claimed)

    async def _complete_and_claim(
        self, call: _Call, queues: tuple[str, ...]
    ) -> tuple[list[LeaseOutcome], set[int], ClaimOutcome, bool] | None:
        """A complete and a claim as one statement (job_complete_claim; while limits exist
        job_complete_claim_limited, and the answer's last item says so): one round trip and one
        commit, where a transaction of two statements makes four round trips; concurrent calls
        on the same queues share it. ``None`` when the statement failed
        (alone: a shared one that fails runs again for each call on its own): it changed
        nothing (a statement is atomic), and the call runs as two statements, which tell the
        transition's error from the claim's."""
        jobs = self.jobs
        try:
            if jobs.coalescing is None:
                (settled,) = await self._complete_claim_statement(queues, [call])
            else:
                settled = await self._submit_complete_claim(queues, call, jobs.coalescing)
        except STATEMENT_REFUSED:
            return None
        taken, outcome = settled.taken, settled.outcome
        outcomes = [taken[i] for i in sorted(taken)]
        if len(taken) < len(call.owned):
            # Items not taken are judged after the commit, from the rows as they are now, as
            # after a transition that waited for them.
            async for attempt in jobs.unit.hot(idempotent=True):
                async with attempt as conn:
                    outcomes = await jobs.judged(conn, LeaseTransition.COMPLETE, call.owned, taken)
        return outcomes, set(taken), outcome, settled.limited

    async def _submit_complete_claim(
        self, queues: tuple[str, ...], call: _Call, coalescing: CoalescingPolicy
    ) -> _Settled:
        """The call's share of a job_complete_claim shared with concurrent calls on ``queues``."""
        calls = self._complete_claims.get(queues)
        if calls is None:
            calls = self._complete_claims[queues] = Coalescer(
                lambda batch: self._complete_claim_statement(queues, batch),
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
            if calls.idle and self._complete_claims.get(queues) is calls:
                del self._complete_claims[queues]
        return settled

    async def _complete_claim_statement(
        self, queues: tuple[str, ...], calls: Sequence[_Call]
    ) -> list[_Settled]:
        """One job_complete_claim for ``calls``: their leases in order, then their claim slots
        in order (each call's ``max_jobs``, best jobs to the earliest call); answers each
        call's share."""
        jobs = self.jobs
        items = [item for call in calls for item in call.owned]
        slots = [
            ClaimSlot(call.worker_id, call.key_id, call.ask.lease_seconds)
            for call in calls
            for _ in range(call.ask.max_jobs)
        ]
        limited = jobs.flow_active
        # Not idempotent: a repeat after a commit whose answer was lost would claim again.
        store = jobs.stores.jobs
        async for attempt in jobs.unit.hot():
            async with attempt as conn:
                if limited:
                    taken, outcome = await store.job_complete_claim_limited(
                        conn, items=items, queues=queues, slots=slots, window=FLOW_WINDOW
                    )
                else:
                    taken, outcome = await store.job_complete_claim(
                        conn, items=items, queues=queues, slots=slots
                    )
        jobs.unit.statements["lease_complete"] += 1
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
