"""The ops side of the service: reads for people and dashboards, and the admin actions.

Reads (listings, search, queue counts, throughput, workers, the audit trail) cost what their
page costs, never a count of the history: counts come from the trigger-kept counters
(``queue_counts``, ``queue_throughput``). Actions name who acts and record themselves in the
audit trail. Bulk actions run in batches of ``bulk_batch_size`` jobs, each one statement
committed on its own, so no lock is held long and no action becomes one huge transaction.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from app.domain.blockers import blockers_of
from app.domain.bounds import valid_id
from app.domain.records import (
    AuditEntry,
    BulkCandidate,
    Job,
    JobBlockers,
    QueuePut,
    QueueStats,
    QueueSwitch,
    QueueThroughput,
    WorkerLeases,
)
from app.domain.states import (
    BulkAction,
    JobStatus,
    Operation,
    bulk_states,
    bulk_states_allowed,
    states_of,
)
from app.domain.types import (
    WORKER_LIVE_SECONDS,
    AuditFilter,
    Blocker,
    BulkOutcome,
    JobEvent,
    JobSearch,
    ListFilter,
    NotGiven,
    OpsOutcome,
)
from app.errors import InvalidInput, InvalidTransition, NotFound, QueueNotEmpty
from app.queue.cursors import decode_cursor, encode_cursor
from app.queue.events import Events
from app.store import Stores
from app.store.conn import Conn
from app.store.unit import UnitOfWork

# Who the audit trail names for an ops action called from inside the process with no actor.
INTERNAL_ACTOR = "internal"

# Resuming a queue may make its whole backlog claimable: wake every waiter on it.
RESUME_WAKE_COUNT = 1_000_000

# The job event a bulk action's changed job makes (deletes make none: no state is entered).
_BULK_EVENT = {BulkAction.RETRY: "retried", BulkAction.CANCEL: "cancelled"}


def _search_detail(search: JobSearch) -> dict[str, Any]:
    """The search as the audit trail records it (fields that narrow it only)."""
    detail: dict[str, Any] = {
        "queue": search.queue,
        "status": search.status.value if search.status is not None else None,
        "type": search.type,
        "payload": search.payload,
        "created_after": search.created_after.isoformat() if search.created_after else None,
        "created_before": search.created_before.isoformat() if search.created_before else None,
    }
    return {k: v for k, v in detail.items() if v is not None}


class OpsService:
    """Reads for people and dashboards, and the admin actions on jobs and queues."""

    def __init__(
        self,
        *,
        unit: UnitOfWork,
        stores: Stores,
        events: Events,
        bulk_batch_size: int = 1000,
    ) -> None:
        self.unit = unit
        self.stores = stores
        self.events = events
        self.bulk_batch_size = bulk_batch_size

    # -- reads -------------------------------------------------------------------------------

    async def search(
        self, search: JobSearch, *, limit: int, after: str | None
    ) -> tuple[list[Job], str | None]:
        """A page of the jobs a search covers, newest first, and the next page's cursor
        (``None`` at the end). Keyset pagination by id: a page costs its rows, never an OFFSET.
        """
        where = ListFilter(
            search=search,
            before_id=decode_cursor(after) if after is not None else None,
            limit=limit + 1,
        )

        async for attempt in self.unit.ops():
            async with attempt as conn:
                rows = await self.stores.jobs.job_list(conn, where=where)
        next_cursor = encode_cursor(rows[limit - 1].id) if len(rows) > limit else None
        return rows[:limit], next_cursor

    async def queue_stats(self) -> list[QueueStats]:
        """Counts per queue and state."""
        async for attempt in self.unit.ops():
            async with attempt as conn:
                stats = await self.stores.queues.queue_stats(conn)
        return stats

    async def queue_throughput(self, *, minutes: int = 60) -> list[QueueThroughput]:
        """Outcomes per queue and minute (queue, minute, outcome, jobs) over the last ``minutes``."""

        async for attempt in self.unit.ops():
            async with attempt as conn:
                rows = await self.stores.queues.queue_throughput(conn, minutes=minutes)
        return rows

    async def workers(self, *, queue_patterns: Sequence[str] | None = None) -> list[WorkerLeases]:
        """Workers holding leases now; with ``queue_patterns`` (LIKE), only in matching queues."""

        async for attempt in self.unit.ops():
            async with attempt as conn:
                rows = await self.stores.jobs.worker_list(conn, queue_patterns=queue_patterns)
        return rows

    async def blockers(self, job_id: int) -> tuple[JobBlockers, list[Blocker]]:
        """What the blockers were read from (the job's id, status and queue among them), and
        what holds the job back now if it is pending or waiting (nothing for other states)."""
        if not valid_id(job_id):
            raise NotFound(f"job {job_id} not found")
        async for attempt in self.unit.ops():
            async with attempt as conn:
                row = await self.stores.jobs.job_blockers(
                    conn, job_id=job_id, live_seconds=WORKER_LIVE_SECONDS
                )
        if row is None:
            raise NotFound(f"job {job_id} not found")
        return row, blockers_of(row)

    # -- bulk actions ------------------------------------------------------------------------

    def _bulk_states(self, action: BulkAction, search: JobSearch) -> list[JobStatus]:
        states = bulk_states(action, search.status)
        if states is None:
            allowed = ", ".join(sorted(s.value for s in bulk_states_allowed(action)))
            raise InvalidInput(
                f"bulk {action.value} takes {allowed} jobs, not {search.status}",
                errors=[{"field": "body.status", "message": f"must be one of: {allowed}"}],
            )
        return states

    async def bulk_preview(self, action: BulkAction, search: JobSearch) -> int:
        """How many jobs ``action`` would change now (what a confirmation states)."""
        states = self._bulk_states(action, search)

        async for attempt in self.unit.ops():
            async with attempt as conn:
                count = await self.stores.jobs.job_count(conn, search=search, statuses=states)
        return count

    async def bulk(
        self,
        action: BulkAction,
        search: JobSearch,
        *,
        actor: str = INTERNAL_ACTOR,
        actor_key_id: int | None = None,
    ) -> BulkOutcome:
        """Applies ``action`` to every job the search covers, in batches; answers the exact count.

        Each batch takes the next ``bulk_batch_size`` jobs of the search, newest first below the
        previous batch's lowest id, locks them, checks their state again and changes them, in
        one statement that commits on its own: jobs that another call moved meanwhile are left
        alone and not counted, and jobs enqueued after the action began (ids past the highest
        id read first) are not touched. One audit row records the action with
        its search, count and batches.
        """
        states = self._bulk_states(action, search)
        async for attempt in self.unit.ops():
            async with attempt as conn:
                below = await self.stores.jobs.job_id_ceiling(conn)
        changed = 0
        batches = 0
        while below is not None:
            async for attempt in self.unit.ops():
                async with attempt as conn:
                    rows = await self.stores.jobs.job_bulk_batch(
                        conn,
                        action=action,
                        search=search,
                        statuses=states,
                        below_id=below,
                        batch_size=self.bulk_batch_size,
                        actor=actor,
                        actor_key_id=actor_key_id,
                    )
            if not rows:
                break
            batches += 1
            moved = [r for r in rows if r.changed]
            changed += len(moved)
            self._bulk_committed(action, moved)
            if len(rows) < self.bulk_batch_size:
                break
            below = min(r.id for r in rows)

        detail = {"search": _search_detail(search), "jobs": changed, "batches": batches}

        async for attempt in self.unit.ops():
            async with attempt as conn:
                await self.stores.audit.audit_insert(
                    conn,
                    actor=actor,
                    actor_key_id=actor_key_id,
                    action=f"bulk.{action.value}",
                    outcome="changed" if changed else "unchanged",
                    queue=search.queue,
                    detail=detail,
                )
        return BulkOutcome(action=action, changed=changed, batches=batches)

    def _bulk_committed(self, action: BulkAction, moved: Sequence[BulkCandidate]) -> None:
        """Tells observers of a committed batch and wakes waiters for retried jobs."""
        kind = _BULK_EVENT.get(action)
        if kind is None:
            return
        status = JobStatus.PENDING if action is BulkAction.RETRY else JobStatus.CANCELLED
        self.events.publish([JobEvent(kind, r.id, r.queue, status=status) for r in moved])
        if action is BulkAction.RETRY:
            self.events.wake_queues(r.queue for r in moved)

    # -- ops actions -------------------------------------------------------------------------

    # Each ops action names who acts (``actor``: an API key's name, "anonymous" or "cli:<user>",
    # and the key's id) and records itself in the audit trail with its change: retry and pause
    # in their own statement, cancel in its transaction. A refused action (404, 409) records
    # nothing; a repeat that changes nothing (cancelling a cancelled job, pausing a paused
    # queue) records "unchanged".

    async def cancel(
        self, job_id: int, *, actor: str = INTERNAL_ACTOR, actor_key_id: int | None = None
    ) -> Job:
        """Cancels a scheduled, pending or running job; cancelling a cancelled job answers it.

        One statement locks the row, decides and answers, so the answer is the job's state as
        the decision saw it, whatever commits around it. The audit row follows in the same
        transaction, while the row is still locked; the job's history records it in the
        statement itself.
        """
        if not valid_id(job_id):
            raise NotFound(f"job {job_id} not found")

        async for attempt in self.unit.ops(transaction=True):
            async with attempt as conn:
                outcome = await self.stores.jobs.job_cancel(
                    conn, job_id=job_id, actor=actor, actor_key_id=actor_key_id
                )
                if outcome is not None and (
                    outcome.changed or outcome.job.status == JobStatus.CANCELLED
                ):
                    await self.stores.audit.audit_insert(
                        conn,
                        actor=actor,
                        actor_key_id=actor_key_id,
                        action="job.cancel",
                        outcome="changed" if outcome.changed else "unchanged",
                        queue=outcome.job.queue,
                        job_id=job_id,
                        state_before=outcome.status_before,
                        state_after=outcome.job.status,
                    )
        if outcome is None:
            raise NotFound(f"job {job_id} not found")
        status = outcome.job.status
        if outcome.changed:
            self.events.publish(
                [
                    JobEvent(
                        "cancelled", job_id, outcome.job.queue, status=status, type=outcome.job.type
                    )
                ]
            )
            if outcome.status_before == JobStatus.RUNNING and outcome.job.flow_keys:
                self.events.wake(outcome.job.queue, 1)  # its running slots are free again
        if outcome.changed or status == JobStatus.CANCELLED:
            return outcome.job
        raise InvalidTransition(
            f"job {job_id} is {status}; only {states_of(Operation.CANCEL)} jobs can be cancelled"
        )

    async def retry(
        self, job_id: int, *, actor: str = INTERNAL_ACTOR, actor_key_id: int | None = None
    ) -> Job:
        """Puts a dead, cancelled or succeeded job back to pending with attempts reset."""
        job = await self._to_pending(
            job_id,
            lambda conn: self.stores.jobs.job_retry(
                conn, job_id=job_id, actor=actor, actor_key_id=actor_key_id
            ),
            Operation.RETRY,
            "be retried",
        )
        self.events.publish(
            [JobEvent("retried", job_id, job.queue, status=job.status, type=job.type)]
        )
        return job

    async def run_now(
        self, job_id: int, *, actor: str = INTERNAL_ACTOR, actor_key_id: int | None = None
    ) -> Job:
        """Makes a scheduled job (delayed, or waiting out a retry's backoff) due now."""
        return await self._to_pending(
            job_id,
            lambda conn: self.stores.jobs.job_run_now(
                conn, job_id=job_id, actor=actor, actor_key_id=actor_key_id
            ),
            Operation.RUN_NOW,
            "be run now",
        )

    async def _to_pending(
        self,
        job_id: int,
        statement: Callable[[Conn], Awaitable[OpsOutcome | None]],
        operation: Operation,
        verb: str,
    ) -> Job:
        """Runs an ops statement that moves one job to pending (it audits itself), wakes the
        job's queue; ``NotFound`` or ``InvalidTransition`` when it moved nothing."""
        if not valid_id(job_id):
            raise NotFound(f"job {job_id} not found")

        async for attempt in self.unit.ops():
            async with attempt as conn:
                outcome = await statement(conn)
        if outcome is None:
            raise NotFound(f"job {job_id} not found")
        if not outcome.changed:
            raise InvalidTransition(
                f"job {job_id} is {outcome.job.status}; only {states_of(operation)} jobs can {verb}"
            )
        self.events.wake(outcome.job.queue, 1)
        return outcome.job

    async def set_paused(
        self,
        name: str,
        *,
        paused: bool,
        actor: str = INTERNAL_ACTOR,
        actor_key_id: int | None = None,
    ) -> QueueSwitch:
        """Pauses or resumes a queue; resuming wakes the queue's waiters."""

        async for attempt in self.unit.ops():
            async with attempt as conn:
                row = await self.stores.queues.queue_set_paused(
                    conn, name=name, paused=paused, actor=actor, actor_key_id=actor_key_id
                )
        if row is None:
            raise NotFound(
                f"queue {name} not found: create it with PUT /v1/queues/{name} to pause it "
                "before its first job"
            )
        if not paused:
            self.events.wake(name, RESUME_WAKE_COUNT)
        return row

    async def queue_put(
        self,
        name: str,
        *,
        paused: bool | None,
        callback_url: str | NotGiven | None,
        actor: str = INTERNAL_ACTOR,
        actor_key_id: int | None = None,
    ) -> tuple[QueuePut, bool]:
        """Creates a queue or sets its switch and callback (None / NOT_GIVEN keep them)."""
        async for attempt in self.unit.ops():
            async with attempt as conn:
                row = await self.stores.queues.queue_put(
                    conn,
                    name=name,
                    paused=paused,
                    callback_url=callback_url,
                    actor=actor,
                    actor_key_id=actor_key_id,
                )
        if paused is False:
            self.events.wake(name, RESUME_WAKE_COUNT)
        return row, bool(row.created)

    async def queue_delete(
        self, name: str, *, actor: str = INTERNAL_ACTOR, actor_key_id: int | None = None
    ) -> None:
        """Deletes a queue that no job names, whatever the jobs' states.

        Finished jobs block it too: they are what an operator looks at after the fact (dead
        jobs above all), and while they exist the overview lists the queue anyway.
        """

        async for attempt in self.unit.ops():
            async with attempt as conn:
                row = await self.stores.queues.queue_delete(
                    conn, name=name, actor=actor, actor_key_id=actor_key_id
                )
        if row.deleted:
            return
        unfinished, finished = int(row.unfinished), int(row.finished)
        if unfinished or finished:
            raise QueueNotEmpty(
                f"queue {name} still holds {unfinished} unfinished and {finished} finished jobs: "
                "cancel or finish the unfinished ones and delete the finished ones "
                "(POST /v1/jobs/bulk/cancel and /v1/jobs/bulk/delete with this queue), or let "
                "the pruner remove them, then delete the queue"
            )
        raise NotFound(f"queue {name} not found")

    async def audit_list(
        self,
        *,
        action: str | None,
        actor: str | None,
        limit: int,
        after: str | None,
        queue_patterns: Sequence[str] | None = None,
    ) -> tuple[list[AuditEntry], str | None]:
        """A page of the audit trail, newest first, and the next page's cursor (``None`` at the end).

        ``queue_patterns`` (SQL LIKE patterns) keeps only entries of matching queues, which
        leaves out the key operations.
        """
        where = AuditFilter(
            action=action,
            actor=actor,
            queue_patterns=tuple(queue_patterns) if queue_patterns is not None else None,
            before_id=decode_cursor(after) if after is not None else None,
            limit=limit + 1,
        )

        async for attempt in self.unit.ops():
            async with attempt as conn:
                rows = await self.stores.audit.audit_list(conn, where=where)
        next_cursor = encode_cursor(rows[limit - 1].id) if len(rows) > limit else None
        return rows[:limit], next_cursor
