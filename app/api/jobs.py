"""Producer and ops endpoints on jobs: enqueue (single and batch), read, search, cancel, retry, run now, bulk actions."""

# No ``from __future__ import annotations`` here: the endpoints are annotated with request models
# built for the app's settings inside build_router, which FastAPI must see as classes.

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Annotated, Literal

from fastapi import APIRouter, Header, Query, Request, Response, status

from app.api import schemas as wire
from app.api.auth import allow_queue, requires
from app.api.deps import Services
from app.api.filters import (
    CURSOR_MAX_CHARS,
    ERROR_FILTER_MAX_CHARS,
    NO_NUL_PATTERN,
    PAYLOAD_FILTER_MAX_CHARS,
    job_search,
    payload_filter,
)
from app.api.job_models import job_models
from app.api.new_jobs import new_callback, new_job, plain_jobs
from app.api.render import job, jobs_response, json_response
from app.api.schemas import (
    BatchIds,
    Job,
    JobBatch,
    JobPage,
    TraceParent,
)
from app.api.webhook_models import require_signing
from app.auth.keys import Permission, Principal
from app.domain.records import Job as JobRow
from app.domain.records import JobHead
from app.domain.states import BulkAction, JobState
from app.errors import PROBLEM, IdempotencyKeyReused, InvalidInput
from app.http import tracing
from app.http.disconnect import client_gone
from app.http.lean import LeanRoute
from app.queue.services import Services as ServiceSet
from app.settings import Settings


@contextlib.contextmanager
def _reused_key_named(field: Callable[[int], str]) -> Iterator[None]:
    """Names the field of a reused idempotency key from the position the core reports."""
    try:
        yield
    except IdempotencyKeyReused as reused:
        raise IdempotencyKeyReused(
            reused.detail,
            item=reused.item,
            errors=[
                {"field": field(reused.item), "message": "key reused with a different request"}
            ],
        ) from None


async def check_parents(
    caller: Principal, services: ServiceSet, named: Sequence[tuple[str, Sequence[int]]]
) -> None:
    """422 naming the field of the first parent that does not exist or that the caller's key
    may not see (the two are told apart for nobody: a scoped key learns nothing of others)."""
    wanted = {i for _, ids in named for i in ids}
    if not wanted:
        return
    found = await services.workflows.parent_queues(sorted(wanted))
    for field, ids in named:
        for position, job_id in enumerate(ids):
            queue = found.get(job_id)
            if queue is None or not caller.covers(queue):
                raise InvalidInput(
                    f"depends_on names job {job_id}, which does not exist",
                    errors=[{"field": f"{field}[{position}]", "message": "job not found"}],
                )


def build_router(settings: Settings) -> APIRouter:
    """The producer routes, validating against this app's limits (and documenting them)."""
    router = APIRouter(prefix="/v1/jobs", tags=["jobs"], route_class=LeanRoute)

    queue_max = settings.queue_name_max_chars
    Queue = Annotated[str, wire.queue_name_rule(queue_max), wire.queue_name_doc(queue_max)]
    Key = Annotated[str, wire.at_most(settings.idempotency_key_max_chars)]
    # Built for this app's limits, as every request that makes a job is (job_models.py).
    models = job_models(settings)
    EnqueueRequest = models.enqueue
    EnqueueBatchRequest = models.batch

    @router.post(
        "",
        status_code=status.HTTP_201_CREATED,
        response_model=Job,
        responses={
            200: {"model": Job, "description": "Replay of an idempotent request"},
            422: PROBLEM,
        },
    )
    async def enqueue_job(
        caller: Annotated[Principal, requires(Permission.ENQUEUE)],
        sent: EnqueueRequest,  # type: ignore[valid-type]  # a class built above
        services: Services,
        idempotency_key: Annotated[
            Key | None,
            Header(
                alias="Idempotency-Key",
                description="Same as the body's idempotency_key (they must agree when both "
                "are sent).",
            ),
        ] = None,
        traceparent: TraceParent = None,
    ) -> Response:
        """Enqueues one job (201); a replay of the same idempotent request answers the job with 200."""
        body: wire.EnqueueRequest = sent
        allow_queue(caller, body.queue, field="body.queue")
        require_signing(settings, caller, [("body.callback_url", body.callback_url)])
        if idempotency_key is not None:
            if body.idempotency_key is not None and body.idempotency_key != idempotency_key:
                raise InvalidInput(
                    "the Idempotency-Key header and the idempotency_key field differ",
                    errors=[{"field": "header.Idempotency-Key", "message": "differs from body"}],
                )
            body = body.model_copy(update={"idempotency_key": idempotency_key})
        if body.depends_on:
            await check_parents(caller, services, [("body.depends_on", body.depends_on)])
        with (
            tracing.span(
                "enqueue",
                "PRODUCER",
                traceparent=tracing.valid_traceparent(traceparent),
                queues=(body.queue,),
                operation_type="send",
            ) as span,
            _reused_key_named(lambda _: "idempotency_key"),
        ):
            [(row, created)] = await services.jobs.enqueue(
                [new_job(body, traceparent=span.traceparent, key_id=caller.key_id)]
            )
            span.messages((row.id,))
        return json_response(job(row), status_code=201 if created else 200)

    @router.post(
        "/batch",
        status_code=status.HTTP_201_CREATED,
        response_model=JobBatch | BatchIds,
        responses={
            200: {"model": JobBatch | BatchIds, "description": "Every job already existed"},
            422: PROBLEM,
        },
    )
    async def enqueue_batch(
        caller: Annotated[Principal, requires(Permission.ENQUEUE)],
        sent: EnqueueBatchRequest,  # type: ignore[valid-type]  # a class built above
        services: Services,
        idempotency_key: Annotated[
            str | None,
            # Read only to refuse it; not offered in the contract.
            Header(alias="Idempotency-Key", include_in_schema=False),
        ] = None,
        traceparent: TraceParent = None,
        answer: Annotated[
            Literal["jobs", "ids"],
            Query(
                description="jobs: every job as GET /v1/jobs/{id} shows it (JobBatch); ids: only "
                "their ids and whether each was created (BatchIds), for producers that need no "
                "more: the service then renders nothing per job."
            ),
        ] = "jobs",
    ) -> Response:
        """Enqueues many jobs in one transaction, all or nothing; answers the jobs in order.

        Idempotency is per job (each job's ``idempotency_key``); an ``Idempotency-Key`` header
        would be ambiguous for a batch and is refused rather than ignored.
        """
        body: wire.EnqueueBatchRequest = sent
        if caller.scoped:
            for index, item in enumerate(body.jobs):
                allow_queue(caller, item.queue, field=f"body.jobs[{index}].queue")
            if body.callback is not None:
                allow_queue(caller, body.callback.queue, field="body.callback.queue")
        await check_parents(
            caller,
            services,
            [
                (f"body.jobs[{i}].depends_on", j.depends_on)
                for i, j in enumerate(body.jobs)
                if j.depends_on
            ],
        )
        require_signing(
            settings,
            caller,
            [
                *(
                    (f"body.jobs[{i}].callback_url", j.callback_url)
                    for i, j in enumerate(body.jobs)
                ),
                (
                    "body.callback.callback_url",
                    body.callback.callback_url if body.callback else None,
                ),
            ],
        )
        if idempotency_key is not None:
            raise InvalidInput(
                "Idempotency-Key is not accepted on a batch; give each job an idempotency_key",
                errors=[
                    {
                        "field": "header.Idempotency-Key",
                        "message": "not accepted on a batch; use jobs[i].idempotency_key",
                    }
                ],
            )
        with (
            tracing.span(
                "enqueue",
                "PRODUCER",
                traceparent=tracing.valid_traceparent(traceparent),
                queues=[item.queue for item in body.jobs],
                operation_type="send",
            ) as span,
            _reused_key_named(
                lambda i: (
                    "body.callback.idempotency_key"
                    if i == len(body.jobs)
                    else f"body.jobs[{i}].idempotency_key"
                )
            ),
        ):
            plain = (
                plain_jobs(body.jobs, traceparent=span.traceparent, key_id=caller.key_id)
                if body.callback is None
                else None
            )
            # The ids answer needs only the created jobs' heads (job_enqueue_ids).
            if plain is not None:
                created = await services.jobs.enqueue_plain(plain, heads=answer == "ids")
                answered: list[tuple[JobRow | JobHead, bool]] = [(row, True) for row in created]
            else:
                answered = await services.jobs.enqueue_heads(
                    [
                        new_job(j, traceparent=span.traceparent, key_id=caller.key_id)
                        for j in body.jobs
                    ],
                    callback=new_callback(
                        body.callback, traceparent=span.traceparent, key_id=caller.key_id
                    )
                    if body.callback is not None
                    else None,
                    heads=answer == "ids",
                )
            span.messages([row.id for row, _ in answered])
        any_created = any(created for _, created in answered)
        if answer == "ids":
            batch = answered if body.callback is None else answered[:-1]
            return json_response(
                {
                    "ids": [row.id for row, _ in batch],
                    "created": [created for _, created in batch],
                    "callback_id": answered[-1][0].id if body.callback is not None else None,
                },
                status_code=201 if any_created else 200,
            )
        rows = [row for row, _ in answered if isinstance(row, JobRow)]  # all: no heads
        if body.callback is None:
            return jobs_response(rows, status_code=201 if any_created else 200)
        return jobs_response(
            rows[:-1], status_code=201 if any_created else 200, callback=job(rows[-1])
        )

    class BulkRequest(wire.BulkRequest):
        __doc__ = wire.BulkRequest.__doc__
        queue: Queue | None = None
        type: Annotated[str, wire.at_most(settings.type_max_chars)] | None = None

    @router.get("", response_model=JobPage, responses={422: PROBLEM})
    async def list_jobs(
        caller: Annotated[Principal, requires(Permission.READ_JOBS)],
        services: Services,
        queue: Queue | None = None,
        status: Annotated[
            JobState | None,
            Query(
                description="A state; retrying: scheduled jobs waiting out a retry's backoff "
                "(scheduled lists those too, and jobs scheduled for later)."
            ),
        ] = None,
        type: Annotated[
            str | None,
            Query(min_length=1, max_length=settings.type_max_chars, pattern=NO_NUL_PATTERN),
        ] = None,
        payload: Annotated[
            str | None,
            Query(
                min_length=1,
                max_length=PAYLOAD_FILTER_MAX_CHARS,
                description="Jobs whose payload contains this JSON value (jsonb @>), e.g. "
                '{"user": 42}; URL-encoded.',
            ),
        ] = None,
        created_after: Annotated[
            wire.Instant | None, Query(description="Created at or after (RFC 3339, offset).")
        ] = None,
        created_before: Annotated[
            wire.Instant | None, Query(description="Created before (RFC 3339, offset).")
        ] = None,
        error: Annotated[
            str | None,
            Query(
                min_length=1,
                max_length=ERROR_FILTER_MAX_CHARS,
                pattern=NO_NUL_PATTERN,
                description="Jobs whose last error contains this text (case-insensitive).",
            ),
        ] = None,
        limit: Annotated[int, Query(ge=1, le=settings.list_max_limit)] = 50,
        after: Annotated[
            str | None,
            Query(max_length=CURSOR_MAX_CHARS, description="next_cursor of the previous page"),
        ] = None,
    ) -> Response:
        """Lists and searches jobs newest first with keyset pagination (never OFFSET).

        Filters combine: queue, state, type, payload containment, creation time range, error
        text. A key
        scoped to some queues sees only their jobs; naming another queue is a 403.
        """
        search = job_search(
            caller,
            prefix="query.",
            queue=queue,
            status=status,
            type=type,
            payload=payload_filter(payload, field="query.payload") if payload is not None else None,
            created_after=created_after,
            created_before=created_before,
            error=error,
        )
        rows, next_cursor = await services.ops.search(search, limit=limit, after=after)
        return jobs_response(rows, next_cursor=next_cursor)

    # Before the /{job_id}/... routes, which would otherwise take "bulk" for a job id.
    @router.post("/bulk/{action}", response_model=wire.BulkResult, responses={422: PROBLEM})
    async def bulk_action(
        caller: Annotated[Principal, requires(Permission.OPERATE)],
        action: BulkAction,
        body: BulkRequest,
        services: Services,
    ) -> wire.BulkResult:
        """Retries, cancels or deletes every job a search covers, in batches; answers how many.

        Each batch (``JOBQ_BULK_BATCH_SIZE`` jobs) is one statement that locks its jobs, checks
        their state again and changes them, committed on its own: no long lock, no huge
        transaction. Jobs another call moved meanwhile are left alone and not counted; jobs
        enqueued after the action began are not touched. With ``dry_run`` it answers how many
        it would change now and changes none. Recorded in the audit trail with its search and
        count. A key scoped to some queues acts only on their jobs.
        """
        search = job_search(
            caller,
            prefix="body.",
            queue=body.queue,
            status=body.status,
            type=body.type,
            payload=body.payload,
            created_after=body.created_after,
            created_before=body.created_before,
            error=body.error,
            ids=body.ids,
        )
        if body.dry_run:
            count = await services.ops.bulk_preview(action, search)
            return wire.BulkResult(action=action, dry_run=True, changed=count, batches=0)
        outcome = await services.ops.bulk(
            action, search, actor=caller.name, actor_key_id=caller.key_id
        )
        return wire.BulkResult(
            action=action, dry_run=False, changed=outcome.changed, batches=outcome.batches
        )

    @router.get("/{job_id}", response_model=Job, responses={404: PROBLEM})
    async def get_job(
        caller: Annotated[Principal, requires(Permission.READ_JOBS)],
        job_id: int,
        services: Services,
        request: Request,
        wait_seconds: Annotated[
            float,
            Query(
                ge=0,
                le=settings.longpoll_max_wait_seconds,
                allow_inf_nan=False,
                description="Long-poll up to this long for the job to finish (succeeded, dead "
                "or cancelled); the answer is the job as it is then, finished or not.",
            ),
        ] = 0,
    ) -> Response:
        """One job by id (403 when its queue is outside the key's scopes).

        With ``wait_seconds`` > 0 the call long-polls: it answers as soon as the job is
        finished (at once when it is already), or with the job as it is when the wait ends
        (or the instance shuts down): 200 either way, so look at ``status``. The wait holds no
        database connection; a job deleted meanwhile answers 404.
        """
        if not wait_seconds:
            row = await services.jobs.get(job_id)
            allow_queue(caller, row.queue, field="path.job_id")
            return json_response(job(row))
        # The scope first: a job outside it is never marked awaited.
        await _in_scope(caller, job_id, services)
        async with client_gone(request) as gone:
            row = await services.results.wait(job_id, wait_seconds=wait_seconds, stop=gone)
        return json_response(job(row))

    async def _in_scope(caller: Principal, job_id: int, services: ServiceSet) -> None:
        # A job's queue never changes, so reading it before acting cannot race the action.
        if caller.scoped:
            allow_queue(caller, (await services.jobs.get(job_id)).queue, field="path.job_id")

    @router.post("/{job_id}/cancel", response_model=Job, responses={404: PROBLEM, 409: PROBLEM})
    async def cancel_job(
        caller: Annotated[Principal, requires(Permission.OPERATE)], job_id: int, services: Services
    ) -> Response:
        """Cancels a scheduled, pending or running job (a running job's lease ends at once)."""
        await _in_scope(caller, job_id, services)
        return json_response(
            job(await services.ops.cancel(job_id, actor=caller.name, actor_key_id=caller.key_id))
        )

    @router.post("/{job_id}/retry", response_model=Job, responses={404: PROBLEM, 409: PROBLEM})
    async def retry_job(
        caller: Annotated[Principal, requires(Permission.OPERATE)], job_id: int, services: Services
    ) -> Response:
        """Moves a dead, cancelled or succeeded job back to pending with attempts reset."""
        await _in_scope(caller, job_id, services)
        return json_response(
            job(await services.ops.retry(job_id, actor=caller.name, actor_key_id=caller.key_id))
        )

    @router.post("/{job_id}/run-now", response_model=Job, responses={404: PROBLEM, 409: PROBLEM})
    async def run_job_now(
        caller: Annotated[Principal, requires(Permission.OPERATE)], job_id: int, services: Services
    ) -> Response:
        """Makes a scheduled job due now: one delayed, or one waiting out a retry's backoff
        (409 for any other state). Recorded in the audit trail and the job's history."""
        await _in_scope(caller, job_id, services)
        return json_response(
            job(await services.ops.run_now(job_id, actor=caller.name, actor_key_id=caller.key_id))
        )

    return router
