"""One job (``/dashboard/jobs/{id}``): payload, result, errors, lease and timeline; cancel and retry.

A job of a workflow links to the workflow's page; a job with parents (``depends_on``) links to
each (their states read in one search, within the visitor's key's queues). A pending or waiting
job says what holds it back: its blockers, as ``GET /v1/jobs/{id}/blockers`` tells them (for a
waiting job, its unfinished parents or the job of its ordering key that goes first).
"""

from __future__ import annotations

from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any

from fastapi import Response

from app.api.filters import job_search
from app.auth.keys import like_pattern
from app.dashboard import views
from app.dashboard.base import PREFIX, job_id
from app.dashboard.board import READ, READ_OPERATE, Call, Route
from app.dashboard.session import Flash
from app.domain.states import JobStatus
from app.domain.types import Blocker
from app.errors import Forbidden, InvalidTransition

# The job page shows this much of a job's history; GET /v1/jobs/{id}/events pages through all.
HISTORY_SHOWN = 300
# The job page lists this many of a job's parents (depends_on takes up to depends_on_max).
PARENTS_SHOWN = 100


async def _job(call: Call) -> dict[str, Any]:
    found = await call.services.jobs.get(job_id(call.request.path_params.get("job_id", "")))
    row = {**asdict(found), "retrying": found.retrying}
    if not call.caller.principal.covers(row["queue"]):
        raise Forbidden(
            f"Key {call.caller.principal.name!r} is not scoped to queue {row['queue']!r}."
        )
    return row


async def job(call: Call) -> Response:
    """One job: payload, result, errors, progress, checkpoint, lease, timeline, actions."""
    row = await _job(call)
    holder: dict[str, Any] | None = None
    if row["status"] == JobStatus.RUNNING:
        for worker in await call.services.ops.workers(queue_patterns=[like_pattern(row["queue"])]):
            if row["id"] in (worker.job_ids or ()):
                holder = asdict(worker)
                break
    events, more = await call.services.history.events(row["id"], after=None, limit=HISTORY_SHOWN)
    blockers: list[Blocker] = []
    if row["status"] in (JobStatus.PENDING, JobStatus.WAITING):
        _, blockers = await call.services.ops.blockers(row["id"])
    moved_at = max(
        (t for t in (row.get("progress_at"), row.get("started_at")) if t is not None),
        default=None,
    )
    parents = await _parents(call, row)
    stuck_after = call.settings.stuck_after_seconds
    stuck = (
        row["status"] == JobStatus.RUNNING
        and moved_at is not None
        and (datetime.now(UTC) - moved_at).total_seconds() > stuck_after
    )
    return call.page(
        "job",
        nav="jobs",
        job=row,
        holder=holder,
        errors=views.job_errors(row.get("errors"), events),
        progress=views.progress_bar(row.get("progress")),
        timeline=views.timeline(events),
        timeline_more=more is not None,
        blockers=blockers,
        parents=parents,
        parents_more=max(0, len(row.get("depends_on") or ()) - PARENTS_SHOWN),
        moved_at=moved_at,
        stuck=stuck,
        stuck_after=stuck_after,
        set_aside=[asdict(s) for s in await call.services.upkeep.set_aside_of_job(row["id"])],
        set_aside_next=f"{PREFIX}/jobs/{row['id']}",
    )


async def _parents(call: Call, row: dict[str, Any]) -> list[dict[str, Any]]:
    """The first of the job's parents, each with its state (``None``: gone, or in a queue the
    visitor's key does not cover)."""
    ids = list(row.get("depends_on") or ())[:PARENTS_SHOWN]
    if not ids:
        return []
    search = job_search(call.caller.principal, prefix="", ids=ids)
    found, _ = await call.services.ops.search(search, limit=len(ids), after=None)
    state = {j.id: ("retrying" if j.retrying else j.status) for j in found}
    step = {j.id: j.workflow_step for j in found}
    return [{"id": i, "state": state.get(i), "step": step.get(i)} for i in ids]


async def job_cancel(call: Call) -> Response:
    """Cancels one job; back to its page with the outcome."""
    return await _job_action(call, "cancel")


async def job_retry(call: Call) -> Response:
    """Retries one job; back to its page with the outcome."""
    return await _job_action(call, "retry")


async def job_run_now(call: Call) -> Response:
    """Makes a scheduled or retrying job due now; back to its page with the outcome."""
    return await _job_action(call, "run_now")


async def _job_action(call: Call, verb: str) -> Response:
    row = await _job(call)
    principal = call.caller.principal
    try:
        if verb == "cancel":
            await call.services.ops.cancel(
                row["id"], actor=principal.name, actor_key_id=principal.key_id
            )
            flash = Flash("ok", f"Cancelled job {row['id']}")
        elif verb == "run_now":
            await call.services.ops.run_now(
                row["id"], actor=principal.name, actor_key_id=principal.key_id
            )
            flash = Flash("ok", f"Job {row['id']} is due now")
        else:
            await call.services.ops.retry(
                row["id"], actor=principal.name, actor_key_id=principal.key_id
            )
            flash = Flash("ok", f"Retried job {row['id']}: it is pending again")
    except InvalidTransition as exc:
        flash = Flash("error", exc.detail)
    return call.redirect(f"{PREFIX}/jobs/{row['id']}", flash)


# After the jobs page's routes: /jobs/bulk must not be taken for a job id.
ROUTES = (
    Route("GET", PREFIX + "/jobs/{job_id}", job, READ),
    Route("GET", PREFIX + "/fragments/jobs/{job_id}", job, READ),
    Route("POST", PREFIX + "/jobs/{job_id}/cancel", job_cancel, READ_OPERATE, action=True),
    Route("POST", PREFIX + "/jobs/{job_id}/retry", job_retry, READ_OPERATE, action=True),
    Route("POST", PREFIX + "/jobs/{job_id}/run-now", job_run_now, READ_OPERATE, action=True),
)
