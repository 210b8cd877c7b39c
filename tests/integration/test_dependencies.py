"""Jobs that wait for others, decided by PostgreSQL (the triggers of migration 0021).

Each case drives the service on a real database: parents finishing through the lease calls,
the reaper, a cancel; concurrent finishes and enqueues from several connections at once. The
waiting state's moves are app/domain/states.py TRIGGERED; these tests hold the SQL to them.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import asyncpg
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db import create_driver_pool
from app.domain.states import TRIGGERED, JobStatus
from app.domain.types import LeaseUpdate, NewJob
from app.domain.workflows import GraphError, StepSpec
from app.queue.services import Services
from tests.integration.helpers import job_row

Q = "deps"


async def _enqueue(svc: Services, **fields: Any) -> dict[str, Any]:
    [(row, _)] = await svc.jobs.enqueue([NewJob(queue=fields.pop("queue", Q), type="t", **fields)])
    return {"id": row.id, "status": row.status}


async def _run(svc: Services, job_id: int, *, ok: bool = True, retryable: bool = False) -> None:
    """Claims exactly ``job_id`` (it must be the only due job of its queue) and ends it."""
    [job] = await svc.jobs.claim(worker_id="w", queues=[Q], max_jobs=1, lease_seconds=30)
    assert job.id == job_id, (job.id, job_id)
    item = LeaseUpdate(job_id=job.id, lease_id=str(job.lease_id))
    if ok:
        [out] = await svc.jobs.complete(worker_id="w", items=[item])
    else:
        failed = LeaseUpdate(
            job_id=job.id, lease_id=str(job.lease_id), error="boom", retryable=retryable
        )
        [out] = await svc.jobs.fail(worker_id="w", items=[failed])
    assert out.ok


async def _status(engine: AsyncEngine, job_id: int) -> str:
    return str((await job_row(engine, job_id))["status"])


async def _kinds(engine: AsyncEngine, job_id: int) -> list[tuple[str, Any]]:
    async with engine.connect() as conn:
        rows = await conn.execute(
            text("SELECT kind, data FROM job_events WHERE job_id = :id ORDER BY id"),
            {"id": job_id},
        )
        return [(r.kind, r.data) for r in rows]


async def test_a_child_waits_outside_the_claim_and_is_due_in_its_last_parents_transaction(
    svc: Services, clean_db: AsyncEngine
) -> None:
    a = await _enqueue(svc)
    b = await _enqueue(svc)
    child = await _enqueue(svc, depends_on=(a["id"], b["id"]))
    assert child["status"] == JobStatus.WAITING
    await _run(svc, a["id"])
    assert await _status(clean_db, child["id"]) == JobStatus.WAITING
    await _run(svc, b["id"])
    # Due at once: the complete's own transaction moved it (no loop runs in this test).
    assert await _status(clean_db, child["id"]) == JobStatus.PENDING
    assert await _kinds(clean_db, child["id"]) == [
        ("ready", {"after": b["id"], "status": "pending"})
    ]
    [claimed] = await svc.jobs.claim(worker_id="w", queues=[Q], max_jobs=1, lease_seconds=30)
    assert claimed.id == child["id"]
    assert claimed.parents["succeeded"] == 2 and claimed.parents["failed_ids"] == []
    assert [p["id"] for p in claimed.parents["jobs"]] == [a["id"], b["id"]]


async def test_a_child_of_finished_parents_is_due_at_once_and_one_of_a_failed_parent_is_cancelled(
    svc: Services, clean_db: AsyncEngine
) -> None:
    done = await _enqueue(svc)
    await _run(svc, done["id"])
    assert (await _enqueue(svc, depends_on=(done["id"],)))["status"] == JobStatus.PENDING
    await svc.jobs.claim(worker_id="w", queues=[Q], max_jobs=5, lease_seconds=30)

    dead = await _enqueue(svc, queue="other")
    [job] = await svc.jobs.claim(worker_id="w", queues=["other"], max_jobs=1, lease_seconds=30)
    await svc.jobs.fail(
        worker_id="w",
        items=[LeaseUpdate(job_id=job.id, lease_id=str(job.lease_id), retryable=False)],
    )
    assert (await _enqueue(svc, depends_on=(dead["id"],)))["status"] == JobStatus.CANCELLED
    runs_anyway = await _enqueue(svc, depends_on=(dead["id"],), on_parent_failure="run")
    assert runs_anyway["status"] == JobStatus.PENDING


async def test_a_failed_parent_cancels_its_dependents_down_the_graph_unless_they_run_anyway(
    svc: Services, clean_db: AsyncEngine
) -> None:
    parent = await _enqueue(svc)
    child = await _enqueue(svc, depends_on=(parent["id"],))
    grandchild = await _enqueue(svc, depends_on=(child["id"],))
    anyway = await _enqueue(svc, depends_on=(child["id"],), on_parent_failure="run")
    await _run(svc, parent["id"], ok=False)

    assert await _status(clean_db, child["id"]) == JobStatus.CANCELLED
    assert await _status(clean_db, grandchild["id"]) == JobStatus.CANCELLED
    assert await _status(clean_db, anyway["id"]) == JobStatus.PENDING
    [(kind, data)] = await _kinds(clean_db, child["id"])
    assert kind == "cancelled" and data["parent_id"] == parent["id"]
    assert data["parent_status"] == "dead"
    assert set(TRIGGERED[JobStatus.WAITING]) >= {JobStatus.PENDING, JobStatus.CANCELLED}


async def test_a_retrying_parent_holds_its_children_and_a_cancel_of_a_waiting_job_is_allowed(
    svc: Services, clean_db: AsyncEngine
) -> None:
    parent = await _enqueue(svc, max_attempts=3)
    child = await _enqueue(svc, depends_on=(parent["id"],))
    other = await _enqueue(svc, depends_on=(parent["id"],))
    await _run(svc, parent["id"], ok=False, retryable=True)
    assert await _status(clean_db, parent["id"]) == JobStatus.SCHEDULED
    assert await _status(clean_db, child["id"]) == JobStatus.WAITING
    cancelled = await svc.ops.cancel(other["id"])
    assert cancelled.status == JobStatus.CANCELLED


async def test_a_parent_deleted_before_it_finished_cancels_its_waiting_children(
    svc: Services, clean_db: AsyncEngine
) -> None:
    parent = await _enqueue(svc)
    child = await _enqueue(svc, depends_on=(parent["id"],))
    async with clean_db.begin() as conn:
        await conn.execute(text("DELETE FROM jobs WHERE id = :id"), {"id": parent["id"]})
    assert await _status(clean_db, child["id"]) == JobStatus.CANCELLED


async def test_an_unknown_parent_is_refused_with_the_column_named(svc: Services) -> None:
    with pytest.raises(asyncpg.ForeignKeyViolationError) as refused:
        await _enqueue(svc, depends_on=(987654,))
    assert refused.value.column_name == "depends_on"


async def test_fan_in_parents_finishing_at_once_on_many_connections_make_the_child_due_once(
    svc: Services, clean_db: AsyncEngine, database_url: str
) -> None:
    """The race the child's row lock closes: each finish sees the others' only after the lock."""
    pool = await create_driver_pool(database_url, size=24, application_name="fan-in")
    try:
        await _fan_in_rounds(svc, clean_db, pool)
    finally:
        await pool.close()


async def _fan_in_rounds(svc: Services, clean_db: AsyncEngine, driver_pool: Any) -> None:
    for _round in range(5):
        parents = [await _enqueue(svc) for _ in range(24)]
        child = await _enqueue(svc, depends_on=tuple(p["id"] for p in parents))
        jobs = await svc.jobs.claim(worker_id="w", queues=[Q], max_jobs=24, lease_seconds=30)
        assert len(jobs) == 24
        gate = asyncio.Event()

        async def finish(job: Any, gate: asyncio.Event) -> None:
            async with driver_pool.acquire() as conn:
                await gate.wait()
                await conn.execute(
                    "UPDATE jobs SET status = 'succeeded', finished_at = now(), "
                    "lease_ended_by = 'complete' WHERE id = $1",
                    job.id,
                )

        tasks = [asyncio.create_task(finish(j, gate)) for j in jobs]
        gate.set()
        await asyncio.gather(*tasks)
        assert await _status(clean_db, child["id"]) == JobStatus.PENDING
        ready = [k for k, _ in await _kinds(clean_db, child["id"]) if k == "ready"]
        assert ready == ["ready"]
        await svc.jobs.claim(worker_id="w", queues=[Q], max_jobs=1, lease_seconds=30)


async def test_a_child_enqueued_while_its_parent_finishes_is_never_left_waiting(
    svc: Services, clean_db: AsyncEngine, driver_pool: Any
) -> None:
    """The enqueue locks the parent: a finish in flight is waited for and then seen."""
    for _round in range(20):
        parent = await _enqueue(svc)
        [job] = await svc.jobs.claim(worker_id="w", queues=[Q], max_jobs=1, lease_seconds=30)
        item = LeaseUpdate(job_id=job.id, lease_id=str(job.lease_id))
        children, _ = await asyncio.gather(
            asyncio.gather(*(_enqueue(svc, depends_on=(parent["id"],)) for _ in range(4))),
            svc.jobs.complete(worker_id="w", items=[item]),
        )
        for child in children:
            assert await _status(clean_db, child["id"]) == JobStatus.PENDING
        await svc.jobs.claim(worker_id="w", queues=[Q], max_jobs=10, lease_seconds=30)


async def test_a_workflow_runs_parents_first_and_a_retry_resumes_it_after_a_failed_step(
    svc: Services, clean_db: AsyncEngine
) -> None:
    def step(name: str, *after: str) -> StepSpec:
        return StepSpec(name=name, after=after, job=NewJob(queue=Q, type=name, max_attempts=1))

    view = await svc.workflows.create(
        name="etl", steps=[step("load", "transform"), step("extract"), step("transform", "extract")]
    )
    by_name = {s.workflow_step: s for s in view.steps}
    assert [s.workflow_step for s in view.steps] == ["extract", "transform", "load"]
    assert by_name["extract"].status == JobStatus.PENDING
    assert by_name["load"].depends_on == [by_name["transform"].id]
    await _run(svc, by_name["extract"].id)
    await _run(svc, by_name["transform"].id, ok=False)
    assert await _status(clean_db, by_name["load"].id) == JobStatus.CANCELLED

    moved = await svc.workflows.retry(view.workflow.id, actor="t")
    assert {m.id: m.status for m in moved} == {
        by_name["transform"].id: JobStatus.PENDING,
        by_name["load"].id: JobStatus.WAITING,
    }
    await _run(svc, by_name["transform"].id)
    await _run(svc, by_name["load"].id)
    after = await svc.workflows.get(view.workflow.id)
    assert {s.status for s in after.steps} == {JobStatus.SUCCEEDED}

    cancelled = await svc.workflows.cancel(view.workflow.id, actor="t")
    assert cancelled == []


async def test_a_workflow_cancel_ends_every_open_step_and_is_audited(
    svc: Services, clean_db: AsyncEngine
) -> None:
    steps = [
        StepSpec(name="a", after=(), job=NewJob(queue=Q, type="a")),
        StepSpec(name="b", after=("a",), job=NewJob(queue=Q, type="b")),
    ]
    view = await svc.workflows.create(name="w", steps=steps)
    [running] = await svc.jobs.claim(worker_id="w", queues=[Q], max_jobs=1, lease_seconds=30)
    moved = await svc.workflows.cancel(view.workflow.id, actor="admin")
    assert {(m.id, m.status_before) for m in moved} == {
        (running.id, "running"),
        (view.steps[1].id, "waiting"),
    }
    async with clean_db.connect() as conn:
        audit = (
            await conn.execute(text("SELECT action, detail FROM audit_log WHERE actor = 'admin'"))
        ).one()
    assert audit.action == "workflow.cancel" and audit.detail["cancelled"] == 2


@pytest.mark.parametrize(
    ("steps", "index", "field"),
    [
        ([("a", ()), ("a", ())], 1, "name"),
        ([("a", ("nope",))], 0, "after"),
        ([("a", ("a",))], 0, "after"),
        ([("a", ("c",)), ("b", ("a",)), ("c", ("b",))], 0, "after"),
    ],
)
async def test_a_graph_that_cannot_run_is_refused_before_anything_is_written(
    svc: Services,
    clean_db: AsyncEngine,
    steps: list[tuple[str, tuple[str, ...]]],
    index: int,
    field: str,
) -> None:
    specs = [StepSpec(name=n, after=a, job=NewJob(queue=Q, type="t")) for n, a in steps]
    with pytest.raises(GraphError) as refused:
        await svc.workflows.create(name="bad", steps=specs)
    assert (refused.value.index, refused.value.field) == (index, field)
    async with clean_db.connect() as conn:
        assert (await conn.execute(text("SELECT count(*) FROM jobs"))).scalar_one() == 0
        assert (await conn.execute(text("SELECT count(*) FROM workflows"))).scalar_one() == 0


async def test_prune_deletes_workflows_without_steps_and_idle_ordering_keys(
    svc: Services, clean_db: AsyncEngine
) -> None:
    view = await svc.workflows.create(
        name="w", steps=[StepSpec(name="a", after=(), job=NewJob(queue=Q, type="a"))]
    )
    await _enqueue(svc, ordering_key=f"k-{uuid.uuid4().hex}")
    assert await svc.workflows.prune(batch_size=10, idle_key_seconds=0) == 0
    async with clean_db.begin() as conn:
        await conn.execute(text("DELETE FROM jobs"))
    assert await svc.workflows.prune(batch_size=10, idle_key_seconds=0) == 1
    async with clean_db.connect() as conn:
        assert (await conn.execute(text("SELECT count(*) FROM workflows"))).scalar_one() == 0
        assert (await conn.execute(text("SELECT count(*) FROM ordering_keys"))).scalar_one() == 0
    assert view.workflow.id == 1
