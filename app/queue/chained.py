"""A complete, fail or release that claims the worker's next jobs in the same call (``claim_next``).

One HTTP round trip per job for a worker that settles a job and takes the next one:

1. The transition runs first, with its ownership check and verdicts exactly as on its own
   (:meth:`JobService.lease_in`), then the claim for the same worker and key, **in the same
   transaction**: one commit for both. Lease items a call lost answer ``lease_lost`` as
   always, and the claim is made all the same: the worker's slot is free either way.
2. When that claim took nothing and the call may wait (``wait_seconds`` > 0), the call
   long-polls as POST /v1/claim does, through :meth:`JobService.claim`, once the transition has
   committed: no transaction stays open while it waits. The same happens, without waiting, when
   the claim met limit rows it could not use in the transaction (missing, held by others, or
   refusing), as POST /v1/claim claims again in those cases.
3. Should the claim fail, the transition still stands and is answered: when the claim
   statement itself fails, the transaction rolls back and the transition runs again on its own
   (the ordinary, coalesced way); the claim's error comes back beside the results. A lost
   connection is the whole call's 503, as for any lease call: the client repeats it.

These calls bypass the coalescing of lease calls and of claims (app/queue/coalesce.py): each is
one short transaction of its own, which is what makes the single commit possible. Lease calls and
claims without ``claim_next`` coalesce as before.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

from app.domain.records import Job
from app.domain.types import (
    ClaimAsk,
    ClaimSlot,
    LeaseOutcome,
    LeaseTransition,
    LeaseUpdate,
    owned_by,
)
from app.errors import DatabaseUnavailable
from app.queue.jobs import JobService


@dataclass(frozen=True)
class Chained:
    """What a settle-and-claim call did: the transition's verdicts, then the jobs the claim leased.

    ``claim_error``: the claim failed once the transition had committed (its verdicts stand);
    ``claimed`` then holds what it had leased before failing, usually nothing.
    """

    outcomes: list[LeaseOutcome]
    claimed: list[Job]
    claim_error: Exception | None = None


class ChainedClaims:
    """Runs a complete / fail / release and then a claim for the same worker as one call."""

    def __init__(self, jobs: JobService) -> None:
        self.jobs = jobs

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
        jobs = self.jobs
        owned = owned_by(items, worker_id, key_id)
        queues = tuple(sorted(set(ask.queues)))
        slots = [ClaimSlot(worker_id, key_id, ask.lease_seconds)] * ask.max_jobs
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
                raise  # the transition's own error, or a commit whose fate is unknown: as today
            # Rolled back, transition and all: the transition alone, as a call without claim_next.
            alone = {
                LeaseTransition.COMPLETE: jobs.complete,
                LeaseTransition.FAIL: jobs.fail,
                LeaseTransition.RELEASE: jobs.release,
            }[transition]
            return Chained(await alone(worker_id=worker_id, items=owned, key_id=key_id), [], error)
        jobs.lease_announce(transition, owned, outcomes, changed)
        claimed: list[Job] = []
        try:
            taken = [row for row in outcome.by_slot if row is not None]
            claimed = await jobs.handed(worker_id, key_id, taken)
            limits_again = bool(
                outcome.flow_missing or outcome.flow_skipped or outcome.flow_refused
            )
            wanted = ask.max_jobs - len(claimed)
            if wanted and (limits_again or (not claimed and ask.wait_seconds > 0)):
                claimed += await jobs.claim(
                    worker_id=worker_id,
                    queues=ask.queues,
                    max_jobs=wanted,
                    lease_seconds=ask.lease_seconds,
                    # A claim that has jobs answers at once, as POST /v1/claim does.
                    wait_seconds=0 if claimed else ask.wait_seconds,
                    stop=stop,
                    key_id=key_id,
                )
        except Exception as error:  # noqa: BLE001 - the transition committed; its verdicts stand
            return Chained(outcomes, claimed, error)
        return Chained(outcomes, claimed)
