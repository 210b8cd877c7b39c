"""Workflows: graphs of jobs created in one transaction, read, cancelled and retried whole.

A step is a job with ``workflow_id`` and ``workflow_step``; its ``depends_on`` names the steps it
comes after. Which step may run is decided by PostgreSQL (the triggers in app/store/sql/schema/linked.sql), in
the transaction that finishes its last parent; this service creates the graph, reads it, and
cancels or retries it as a whole.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime

from app.domain.bounds import valid_id
from app.domain.records import Job
from app.domain.states import JobStatus
from app.domain.types import JobDefaults, JobEvent
from app.domain.workflow_records import StepMoved, Workflow
from app.domain.workflows import StepSpec, creation_order
from app.errors import IdempotencyKeyReused, InvalidTransition, NotFound
from app.queue.events import Events
from app.store import Stores
from app.store.unit import TRANSACTION_TRIES, UnitOfWork


@dataclass(frozen=True)
class WorkflowView:
    """A workflow and its steps (jobs), in the order they were created; ``created``: whether
    the call that answers it made it (``False``: an idempotent replay)."""

    workflow: Workflow
    steps: list[Job]
    created: bool = True


@dataclass(frozen=True)
class WorkflowKey:
    """A create's idempotency key and the fingerprint of its request (without the key)."""

    key: str
    fingerprint: str


class WorkflowService:
    """Creates, reads, cancels and retries workflows."""

    def __init__(
        self, *, unit: UnitOfWork, stores: Stores, events: Events, defaults: JobDefaults
    ) -> None:
        self.unit = unit
        self.stores = stores
        self.events = events
        self.defaults = defaults

    async def create(
        self,
        *,
        name: str,
        steps: Sequence[StepSpec],
        actor: str | None = None,
        actor_key_id: int | None = None,
        key: WorkflowKey | None = None,
    ) -> WorkflowView:
        """Creates the workflow and every step in one transaction, parents first.

        Raises ``GraphError`` (app/domain/workflows.py) for duplicate or unknown names and
        cycles, before anything is written. Steps without parents are due at once (or at their
        run_at); the others wait.

        With a ``key`` another workflow holds, nothing is written: that workflow is answered
        (``created`` false) when its request had the same fingerprint, else
        ``IdempotencyKeyReused``. Two creates with one key at once make one workflow (the
        insert's conflict clause waits for the other's transaction).
        """
        order = creation_order(steps)
        for _ in range(TRANSACTION_TRIES):
            view = await self._create_once(name, steps, order, actor, actor_key_id, key)
            if view is not None:
                return view
        raise InvalidTransition("the idempotency key's workflow kept being deleted; retry")

    async def _create_once(
        self,
        name: str,
        steps: Sequence[StepSpec],
        order: Sequence[int],
        actor: str | None,
        actor_key_id: int | None,
        key: WorkflowKey | None,
    ) -> WorkflowView | None:
        """One try of :meth:`create`; ``None`` when the key's workflow was deleted between the
        insert that found it and the read of it (the next try may make it again)."""
        has_children = {p for step in steps for p in step.after}
        store = self.stores.workflows
        held: Workflow | None = None
        held_steps: list[Job] = []
        rows: list[Job | None] = []
        async for attempt in self.unit.hot(transaction=True):
            async with attempt as conn:
                workflow = await store.workflow_create(
                    conn,
                    name=name,
                    steps=len(steps),
                    actor=actor,
                    actor_key_id=actor_key_id,
                    idempotency_key=key.key if key is not None else None,
                    idempotency_hash=key.fingerprint if key is not None else None,
                )
                if workflow is not None:
                    ids = await store.job_ids_reserve(conn, n=len(steps))
                    id_of = {steps[i].name: ids[k] for k, i in enumerate(order)}
                    jobs = [
                        replace(
                            self.defaults.apply(steps[i].job),
                            id=id_of[steps[i].name],
                            workflow_id=workflow.id,
                            workflow_step=steps[i].name,
                            depends_on=tuple(id_of[p] for p in steps[i].after) or None,
                            has_dependents=steps[i].name in has_children,
                        )
                        for i in order
                    ]
                    rows = await self.stores.producers.job_enqueue(conn, jobs=jobs)
                elif key is not None:  # the key is another workflow's, committed
                    held = await store.workflow_get_by_idempotency_key(
                        conn, idempotency_key=key.key
                    )
                    if held is not None and held.idempotency_hash == key.fingerprint:
                        held_steps = await store.workflow_steps(conn, workflow_id=held.id)
        if workflow is not None:
            created = sorted((r for r in rows if r is not None), key=lambda r: r.id)
            self.events.publish(
                [JobEvent("enqueued", r.id, r.queue, status=r.status, type=r.type) for r in created]
            )
            self.events.wake_queues(r.queue for r in created if r.status == JobStatus.PENDING)
            return WorkflowView(workflow, created)
        if held is None or key is None:
            return None  # deleted (pruned) since the insert found it
        if held.idempotency_hash != key.fingerprint:
            raise IdempotencyKeyReused(
                f"idempotency key {key.key!r} was used for a different workflow request", item=0
            )
        return WorkflowView(held, held_steps, created=False)

    async def prune(
        self, *, batch_size: int, idle_key_seconds: float, now: datetime | None = None
    ) -> int:
        """Deletes a batch of workflows whose steps are all gone, and one of ordering keys idle
        for ``idle_key_seconds`` with no open job; answers the larger count."""
        async for attempt in self.unit.ops():
            async with attempt as conn:
                workflows = await self.stores.workflows.workflow_prune(
                    conn, older_than_seconds=0, batch_size=batch_size, now=now
                )
                keys = await self.stores.workflows.ordering_key_prune(
                    conn, older_than_seconds=idle_key_seconds, batch_size=batch_size, now=now
                )
        return max(workflows, keys)

    async def unstick_ordering_keys(self, *, recent_seconds: float) -> int:
        """The promoter's sweep: makes due the oldest waiting job of each key enqueued to in the
        last ``recent_seconds`` that has nothing open (a producer that enqueued in SQL, or an
        instance that died between its enqueue and its own check); answers how many moved."""
        async for attempt in self.unit.hot():
            async with attempt as conn:
                moved = await self.stores.workflows.ordering_key_unstick(
                    conn, keys=None, recent_seconds=recent_seconds
                )
        self.events.wake_queues(queue for _, queue, status in moved if status == JobStatus.PENDING)
        return len(moved)

    async def parent_queues(self, ids: Sequence[int]) -> dict[int, str]:
        """The queue of each job of ``ids`` that exists (to check a producer may name it)."""
        valid = [i for i in set(ids) if valid_id(i)]
        if not valid:
            return {}
        async for attempt in self.unit.hot(idempotent=True):
            async with attempt as conn:
                found = await self.stores.workflows.job_parents_found(conn, ids=valid)
        return found

    async def get(self, workflow_id: int) -> WorkflowView:
        """A workflow and its steps; ``NotFound`` for an unknown id."""
        if not valid_id(workflow_id):
            raise NotFound(f"workflow {workflow_id} not found")
        async for attempt in self.unit.ops():
            async with attempt as conn:
                workflow = await self.stores.workflows.workflow_get(conn, workflow_id=workflow_id)
                steps = (
                    await self.stores.workflows.workflow_steps(conn, workflow_id=workflow_id)
                    if workflow is not None
                    else []
                )
        if workflow is None:
            raise NotFound(f"workflow {workflow_id} not found")
        return WorkflowView(workflow, steps)

    async def cancel(
        self, workflow_id: int, *, actor: str, actor_key_id: int | None = None
    ) -> list[StepMoved]:
        """Cancels every open step (a running one's lease ends at once); answers them."""
        return await self._change(workflow_id, cancel=True, actor=actor, key_id=actor_key_id)

    async def retry(
        self, workflow_id: int, *, actor: str, actor_key_id: int | None = None
    ) -> list[StepMoved]:
        """Puts every dead or cancelled step back: pending when its parents all succeeded,
        waiting otherwise (a retried parent's success then moves it). Answers the steps moved."""
        return await self._change(workflow_id, cancel=False, actor=actor, key_id=actor_key_id)

    async def _change(
        self, workflow_id: int, *, cancel: bool, actor: str, key_id: int | None
    ) -> list[StepMoved]:
        if not valid_id(workflow_id):
            raise NotFound(f"workflow {workflow_id} not found")
        async for attempt in self.unit.ops(transaction=True):
            async with attempt as conn:
                found = await self.stores.workflows.workflow_get(conn, workflow_id=workflow_id)
                if found is None:
                    raise NotFound(f"workflow {workflow_id} not found")
                # Every step locked first: a finish in flight commits before the change reads
                # the steps, and its trigger, waiting for these locks, sees the change after.
                await self.stores.workflows.workflow_lock(conn, workflow_id=workflow_id)
                if cancel:
                    moved = await self.stores.workflows.workflow_cancel(
                        conn, workflow_id=workflow_id, actor=actor, actor_key_id=key_id
                    )
                else:
                    moved = await self.stores.workflows.workflow_retry(
                        conn, workflow_id=workflow_id, actor=actor, actor_key_id=key_id
                    )
        kind = "cancelled" if cancel else "retried"
        self.events.publish([JobEvent(kind, m.id, m.queue, status=m.status) for m in moved])
        if not cancel:
            self.events.wake_queues(m.queue for m in moved if m.status == JobStatus.PENDING)
        return moved
