"""A job's history, its blockers and failures grouped by cause: what an operator reads during
an incident.

``GET /v1/jobs/{id}/events`` pages through a job's history; ``GET /v1/jobs/{id}/blockers``
says why a pending job is not running; ``GET /v1/failures`` groups recent
failures by cause; ``POST /v1/failures/{retry,cancel}`` acts on one group's jobs through the
bulk machinery, on exactly the jobs the group holds when it is called.
"""

# No ``from __future__ import annotations``: FastAPI reads the annotations at runtime.

from typing import Annotated, Literal

from fastapi import APIRouter, Path, Query

from app.api import history_models as wire
from app.api.auth import allow_queue, requires
from app.api.deps import Services
from app.api.filters import CURSOR_MAX_CHARS
from app.api.schemas import BulkResult, QueueName
from app.auth.keys import Permission, Principal
from app.domain.bounds import MAX_BIGINT
from app.domain.states import BulkAction, bulk_states
from app.domain.types import JobSearch
from app.errors import PROBLEM
from app.http.strict_json import StrictJSONRoute
from app.queue.history import FailureKey

Observer = Annotated[Principal, requires(Permission.OBSERVE)]
Reader = Annotated[Principal, requires(Permission.READ_JOBS)]
Operator = Annotated[Principal, requires(Permission.OPERATE)]

EVENTS_PAGE_MAX = 500
FAILURE_WINDOW_SECONDS_MAX = 30 * 86_400
FAILURE_GROUPS_MAX = 200


def build_router() -> APIRouter:
    """The history and failure routes."""
    router = APIRouter(prefix="/v1", tags=["history"], route_class=StrictJSONRoute)

    @router.get(
        "/jobs/{job_id}/events",
        response_model=wire.JobEventPage,
        responses={404: PROBLEM, 422: PROBLEM},
    )
    async def job_events(
        caller: Reader,
        services: Services,
        job_id: Annotated[int, Path(ge=1, le=MAX_BIGINT)],
        limit: Annotated[int, Query(ge=1, le=EVENTS_PAGE_MAX)] = 100,
        after: Annotated[
            str | None,
            Query(max_length=CURSOR_MAX_CHARS, description="next_cursor of the previous page"),
        ] = None,
    ) -> wire.JobEventPage:
        """A job's history, oldest first, kept as long as the job: enqueued, promoted, each
        attempt's claim (worker, key, instance), progress milestones (each tenth of a
        ``{"done", "total"}`` progress), release (checkpoint saved, delay), failure (error type,
        message, traceback), expired or timed-out lease, completion, and operators' cancel,
        retry and run-now with who did them."""
        if caller.scoped:
            allow_queue(caller, (await services.jobs.get(job_id)).queue, field="path.job_id")
        rows, next_cursor = await services.history.events(job_id, after=after, limit=limit)
        return wire.JobEventPage(
            events=[
                wire.JobEvent(
                    id=r.id,
                    at=r.at,
                    kind=r.kind,
                    attempt=r.attempt,
                    actor=r.actor,
                    key_name=r.key_name,
                    instance=r.instance,
                    data=r.data,
                )
                for r in rows
            ],
            next_cursor=next_cursor,
        )

    @router.get(
        "/jobs/{job_id}/blockers", response_model=wire.JobBlockers, responses={404: PROBLEM}
    )
    async def job_blockers(
        caller: Reader,
        services: Services,
        job_id: Annotated[int, Path(ge=1, le=MAX_BIGINT)],
    ) -> wire.JobBlockers:
        """Why a pending job is not running: its queue paused, its concurrency key's or queue's
        running slots full (``key customer:42 at 2/2``) or rate bucket empty (until when), or no
        live worker polling its queue (none seen claiming in the last 60 s). Empty for a job in
        any other state, and for a pending job nothing holds back (it is next in line)."""
        job, found = await services.ops.blockers(job_id)
        if caller.scoped:
            allow_queue(caller, job.queue, field="path.job_id")
        return wire.JobBlockers(
            job_id=job.id,
            status=job.status,
            blockers=[wire.Blocker(kind=b.kind, message=b.message, until=b.until) for b in found],
        )

    @router.get("/failures", response_model=wire.FailureList, responses={422: PROBLEM})
    async def failures(
        caller: Observer,
        services: Services,
        window_seconds: Annotated[
            float, Query(gt=0, le=FAILURE_WINDOW_SECONDS_MAX, allow_inf_nan=False)
        ] = 86_400,
        queue: QueueName | None = None,
        limit: Annotated[int, Query(ge=1, le=FAILURE_GROUPS_MAX)] = 50,
    ) -> wire.FailureList:
        """Failed attempts of the last ``window_seconds`` (expired and timed-out leases
        included), grouped by cause as error trackers group them: by queue, job type, error type
        and the fingerprint of the traceback's frames (file and function, no line numbers or
        values) for failures sent with a traceback, else the message with quoted values, e-mail
        addresses, query strings and every token holding a digit masked. Largest group first,
        with counts, first and last seen, where the newest was raised, and sample jobs. Reads at
        most the newest 20,000 failures of the window (``truncated`` says when there were
        more)."""
        if queue is not None:
            allow_queue(caller, queue, field="query.queue")
        found = await services.history.failures(
            window_seconds=window_seconds,
            queue=queue,
            queue_patterns=caller.like_patterns() if queue is None else None,
            limit=limit,
        )
        return wire.FailureList(
            since=found.since,
            groups=[
                wire.FailureGroup(
                    queue=g.queue,
                    type=g.type,
                    error_type=g.error_type,
                    fingerprint=g.fingerprint,
                    grouped_by="traceback" if g.by_traceback else "message",
                    pattern=g.pattern,
                    culprit=g.culprit,
                    failures=g.failures,
                    failures_last_hour=g.failures_last_hour,
                    jobs=g.jobs,
                    dead_jobs=g.dead_jobs,
                    first_seen_at=g.first_seen_at,
                    last_seen_at=g.last_seen_at,
                    last_message=g.last_message,
                    sample_job_ids=list(g.sample_job_ids),
                )
                for g in found.groups
            ],
            scanned=found.scanned,
            truncated=found.truncated,
        )

    @router.post(
        "/failures/{action}", response_model=BulkResult, responses={403: PROBLEM, 422: PROBLEM}
    )
    async def failure_group_action(
        caller: Operator,
        services: Services,
        action: Literal["retry", "cancel"],
        body: wire.FailureGroupAction,
    ) -> BulkResult:
        """Retries (its dead jobs) or cancels (its scheduled and pending jobs: those waiting to
        retry) one failure group, as a bulk action on the group's jobs at this moment (at most
        10,000); ``dry_run`` counts them. Recorded in the audit trail and each job's history."""
        allow_queue(caller, body.queue, field="body.queue")
        bulk = BulkAction(action)
        statuses = [s.value for s in bulk_states(bulk, None) or ()]
        ids = await services.history.failure_group_jobs(
            FailureKey(
                queue=body.queue,
                type=body.type,
                error_type=body.error_type,
                fingerprint=body.fingerprint,
            ),
            window_seconds=body.window_seconds,
            statuses=statuses,
            limit=wire.JOB_ID_LIST_MAX,
        )
        if not ids:
            return BulkResult(action=bulk, dry_run=body.dry_run, changed=0, batches=0)
        search = JobSearch(queue=body.queue, type=body.type, ids=tuple(ids))
        if body.dry_run:
            count = await services.ops.bulk_preview(bulk, search)
            return BulkResult(action=bulk, dry_run=True, changed=count, batches=0)
        outcome = await services.ops.bulk(
            bulk, search, actor=caller.name, actor_key_id=caller.key_id
        )
        return BulkResult(
            action=bulk, dry_run=False, changed=outcome.changed, batches=outcome.batches
        )

    return router
