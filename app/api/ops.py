"""Ops endpoints: queue counts and figures, create / delete, pause / resume, who holds what, the audit trail, health and readiness."""

# No ``from __future__ import annotations`` here: the path type is built for the app's settings
# inside build_router, which FastAPI must see as a type.

from collections import defaultdict
from dataclasses import asdict
from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Query, Response, status

from app.api import schemas
from app.api.audit_models import AuditAction, AuditEntry, AuditPage
from app.api.auth import allow_queue, requires
from app.api.deps import Runtime, Services
from app.api.job_models import job_models
from app.api.queue_models import QUEUE_STATS_WINDOW_MAX, QueueWindowStats
from app.api.schemas import (
    Health,
    MinuteOutcomes,
    QueueList,
    QueueState,
    QueueStats,
    WorkerInfo,
    WorkerList,
    queue_name_doc,
    queue_name_rule,
)
from app.api.webhook_models import require_signing
from app.auth.keys import Permission, Principal
from app.domain.types import NOT_GIVEN
from app.errors import PROBLEM, DatabaseUnavailable, NotReady
from app.http.strict_json import StrictJSONRoute
from app.settings import Settings

Observer = Annotated[Principal, requires(Permission.OBSERVE)]
Operator = Annotated[Principal, requires(Permission.OPERATE)]


def build_router(settings: Settings) -> APIRouter:
    """The ops routes, validating queue names against this app's limits (and documenting them)."""
    router = APIRouter(tags=["ops"], route_class=StrictJSONRoute)
    queue_max = settings.queue_name_max_chars
    Queue = Annotated[str, queue_name_rule(queue_max), queue_name_doc(queue_max)]
    # Its callback_url bound as every job's is (job_models.py).
    QueueSettings = job_models(settings).queue_settings

    @router.get("/v1/queues", response_model=QueueList)
    async def list_queues(caller: Observer, services: Services) -> QueueList:
        """Counts per state for every queue, the oldest due job's age, and throughput: the last
        minute's successes and each minute's outcomes over the last hour.

        Counts come from counters kept by triggers and the age from one index probe per queue,
        so the answer costs the same with a million finished jobs as with none. A key scoped
        to some queues sees only those.
        """
        minutes: dict[str, dict[datetime, MinuteOutcomes]] = defaultdict(dict)
        for row in await services.ops.queue_throughput(minutes=60):
            minute = minutes[row.queue].setdefault(row.minute, MinuteOutcomes(minute=row.minute))
            setattr(minute, row.outcome, int(row.jobs))
        return QueueList(
            queues=[
                QueueStats.model_validate(
                    {**asdict(r), "last_hour": list(minutes.get(r.name, {}).values())}
                )
                for r in await services.ops.queue_stats()
                if caller.covers(r.name)
            ]
        )

    @router.get(
        "/v1/queues/{name}/stats",
        response_model=QueueWindowStats,
        responses={403: PROBLEM, 404: PROBLEM, 422: PROBLEM},
    )
    async def queue_window_stats(
        caller: Observer,
        name: Queue,
        services: Services,
        window_seconds: Annotated[
            float,
            Query(
                gt=0,
                le=QUEUE_STATS_WINDOW_MAX,
                allow_inf_nan=False,
                description="The window: jobs finished in the last this many seconds.",
            ),
        ] = 3600,
    ) -> QueueWindowStats:
        """The queue's jobs that finished in the window: how many succeeded, went dead or were
        cancelled, dead ÷ finished, failed attempts ÷ attempts, and the p50 / p95 / p99 seconds
        of each job's last attempt's wait (due to claim) and run (claim to complete or fail).

        The dashboard's queue page shows the same figures. Computed by PostgreSQL
        (percentile_cont) from the queue's newest finished jobs, a bounded read whatever the
        history (``truncated`` says when the window may hold more); 404 for an unknown queue.
        """
        allow_queue(caller, name, field="path.name")
        [row] = await services.history.queue_window_stats(name, windows=[window_seconds])
        return QueueWindowStats.of(row)

    @router.put(
        "/v1/queues/{name}",
        status_code=status.HTTP_201_CREATED,
        response_model=QueueState,
        responses={
            200: {"model": QueueState, "description": "The queue existed (it has a row or jobs)"},
            403: PROBLEM,
            422: PROBLEM,
        },
    )
    async def put_queue(
        caller: Operator,
        name: Queue,
        services: Services,
        response: Response,
        body: QueueSettings | None = None,  # type: ignore[valid-type]  # a class built above
    ) -> QueueState:
        """Creates the queue (201), so that it can be paused before its first job; a queue that
        exists answers 200. ``paused`` sets its switch; unset keeps it (a new queue is active).

        Enqueueing to a new name still creates its queue as well.
        """
        switches: schemas.QueueSettings | None = body
        allow_queue(caller, name, field="path.name")
        given = switches is not None and "callback_url" in switches.model_fields_set
        callback = switches.callback_url if switches is not None and given else None
        # Signed later with each enqueuing key's secret; without keys, JOBQ_WEBHOOK_SECRET's.
        require_signing(settings, caller, [("body.callback_url", callback)])
        row, created = await services.ops.queue_put(
            name,
            paused=switches.paused if switches is not None else None,
            callback_url=callback if given else NOT_GIVEN,
            actor=caller.name,
            actor_key_id=caller.key_id,
        )
        response.status_code = status.HTTP_201_CREATED if created else status.HTTP_200_OK
        return QueueState.model_validate(asdict(row))

    @router.delete(
        "/v1/queues/{name}",
        status_code=status.HTTP_204_NO_CONTENT,
        response_class=Response,
        responses={403: PROBLEM, 404: PROBLEM, 409: PROBLEM, 422: PROBLEM},
    )
    async def delete_queue(caller: Operator, name: Queue, services: Services) -> Response:
        """Deletes the queue and its switches; 409 while any job, finished or not, names it.

        Finished jobs go with retention (the pruner) or with ``POST /v1/jobs/bulk/delete``.
        """
        allow_queue(caller, name, field="path.name")
        await services.ops.queue_delete(name, actor=caller.name, actor_key_id=caller.key_id)
        return Response(status_code=status.HTTP_204_NO_CONTENT)

    @router.post(
        "/v1/queues/{name}/pause",
        response_model=QueueState,
        responses={404: PROBLEM, 422: PROBLEM},
    )
    async def pause_queue(caller: Operator, name: Queue, services: Services) -> QueueState:
        """Stops claims from this queue (running jobs carry on); 404 for a queue that neither
        was created nor has jobs."""
        allow_queue(caller, name, field="path.name")
        row = await services.ops.set_paused(
            name, paused=True, actor=caller.name, actor_key_id=caller.key_id
        )
        return QueueState.model_validate(asdict(row))

    @router.post(
        "/v1/queues/{name}/resume",
        response_model=QueueState,
        responses={404: PROBLEM, 422: PROBLEM},
    )
    async def resume_queue(caller: Operator, name: Queue, services: Services) -> QueueState:
        """Lets claims take jobs from this queue again; 404 for an unknown queue."""
        allow_queue(caller, name, field="path.name")
        row = await services.ops.set_paused(
            name, paused=False, actor=caller.name, actor_key_id=caller.key_id
        )
        return QueueState.model_validate(asdict(row))

    @router.get("/v1/workers", response_model=WorkerList)
    async def list_workers(caller: Observer, services: Services) -> WorkerList:
        """Workers seen claiming in the last ten minutes (idle, long-polling ones included) and
        every worker holding leases (a worker is its id within its API key): the queues it polls,
        whether it is live (seen in the last 60 s), the jobs it holds with their types, start
        times and lease expiries, the jobq instance, and when it was first and last seen.

        A key scoped to some queues sees only those queues and their jobs.
        """
        rows = await services.workers.overview(queue_patterns=caller.like_patterns())
        return WorkerList(
            workers=[
                WorkerInfo(
                    worker_id=r.worker_id,
                    key_name=r.key_name,
                    queues=r.queues,
                    live=r.live,
                    instance=r.instance,
                    first_seen_at=r.first_seen_at,
                    jobs_held=r.jobs_held,
                    job_ids=r.job_ids,
                    job_types=r.job_types,
                    job_started_at=r.job_started,
                    lease_expiries=r.lease_expiries,
                    next_lease_expiry=r.next_lease_expiry,
                    last_seen_at=r.last_seen_at,
                )
                for r in rows
            ]
        )

    @router.get("/v1/audit", response_model=AuditPage, responses={422: PROBLEM})
    async def list_audit(
        caller: Observer,
        services: Services,
        action: AuditAction | None = None,
        actor: Annotated[
            str | None,
            Query(
                min_length=1,
                max_length=255,
                pattern=r"^[^\x00]+$",
                description='Who acted: a key\'s name, "anonymous" or "cli:<user>".',
            ),
        ] = None,
        limit: Annotated[int, Query(ge=1, le=settings.list_max_limit)] = 50,
        after: Annotated[
            str | None, Query(max_length=200, description="next_cursor of the previous page")
        ] = None,
    ) -> AuditPage:
        """The admin actions recorded (cancel, retry, pause, resume, key create / revoke), newest first.

        Keyset pagination as ``GET /v1/jobs``. A key scoped to some queues sees only the entries
        of those queues, and no key operations.
        """
        rows, next_cursor = await services.ops.audit_list(
            action=action.value if action is not None else None,
            actor=actor,
            limit=limit,
            after=after,
            queue_patterns=caller.like_patterns(),
        )
        return AuditPage(
            entries=[AuditEntry.model_validate(asdict(r)) for r in rows], next_cursor=next_cursor
        )

    @router.get("/healthz", response_model=Health)
    async def healthz() -> Health:
        """The process is up (does not touch the database)."""
        return Health(status="ok")

    @router.get("/readyz", response_model=Health, responses={503: PROBLEM})
    async def readyz(runtime: Runtime) -> Health:
        """The process can serve: the database answers and no background loop it runs has stalled."""
        try:
            await runtime.services.jobs.ping()
        except (OSError, TimeoutError) as exc:
            raise DatabaseUnavailable(f"database unreachable: {exc}") from exc
        stalled = runtime.runner.stalled()
        if stalled:
            raise NotReady(
                "background loops have not finished a batch in time: " + ", ".join(sorted(stalled))
            )
        return Health(status="ok")

    return router
