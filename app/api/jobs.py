"""Producer endpoints: enqueue (single and batch), read, list, cancel, retry."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header, Query, Response, status

from app.api.deps import Service
from app.api.strict_json import StrictJSONRoute
from app.errors import PROBLEM, InvalidInput
from app.queue.states import VisibleStatus
from app.schemas import (
    EnqueueBatchRequest,
    EnqueueRequest,
    IdempotencyKey,
    Job,
    JobBatch,
    JobPage,
    QueueName,
    job_from_row,
)

router = APIRouter(prefix="/v1/jobs", tags=["jobs"], route_class=StrictJSONRoute)


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=Job,
    responses={200: {"model": Job, "description": "Replay of an idempotent request"}, 422: PROBLEM},
)
async def enqueue_job(
    body: EnqueueRequest,
    service: Service,
    response: Response,
    idempotency_key: Annotated[IdempotencyKey | None, Header(alias="Idempotency-Key")] = None,
) -> Job:
    """Enqueues one job (201); a replay of the same idempotent request answers the job with 200."""
    if idempotency_key is not None:
        if body.idempotency_key is not None and body.idempotency_key != idempotency_key:
            raise InvalidInput(
                "the Idempotency-Key header and the idempotency_key field differ",
                errors=[{"field": "header.Idempotency-Key", "message": "differs from body"}],
            )
        body = body.model_copy(update={"idempotency_key": idempotency_key})
    [(row, created)] = await service.enqueue([body])
    if not created:
        response.status_code = status.HTTP_200_OK
    return Job.model_validate(job_from_row(row))


@router.post(
    "/batch",
    status_code=status.HTTP_201_CREATED,
    response_model=JobBatch,
    responses={200: {"model": JobBatch, "description": "Every job already existed"}, 422: PROBLEM},
)
async def enqueue_batch(
    body: EnqueueBatchRequest, service: Service, response: Response
) -> JobBatch:
    """Enqueues many jobs in one transaction, all or nothing; answers the jobs in order."""
    answered = await service.enqueue(body.jobs)
    if not any(created for _, created in answered):
        response.status_code = status.HTTP_200_OK
    return JobBatch(jobs=[Job.model_validate(job_from_row(row)) for row, _ in answered])


@router.get("", response_model=JobPage, responses={422: PROBLEM})
async def list_jobs(
    service: Service,
    queue: QueueName | None = None,
    status: VisibleStatus | None = None,
    type: Annotated[str | None, Query(max_length=255)] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    after: Annotated[
        str | None, Query(max_length=200, description="next_cursor of the previous page")
    ] = None,
) -> JobPage:
    """Lists jobs newest first with keyset pagination (never OFFSET)."""
    rows, next_cursor = await service.list_jobs(
        queue=queue, status=status, type=type, limit=limit, after=after
    )
    return JobPage(
        jobs=[Job.model_validate(job_from_row(r)) for r in rows], next_cursor=next_cursor
    )


@router.get("/{job_id}", response_model=Job, responses={404: PROBLEM})
async def get_job(job_id: int, service: Service) -> Job:
    """One job by id."""
    return Job.model_validate(job_from_row(await service.get(job_id)))


@router.post("/{job_id}/cancel", response_model=Job, responses={404: PROBLEM, 409: PROBLEM})
async def cancel_job(job_id: int, service: Service) -> Job:
    """Cancels a pending or running job (a running job's lease is invalid at once)."""
    return Job.model_validate(job_from_row(await service.cancel(job_id)))


@router.post("/{job_id}/retry", response_model=Job, responses={404: PROBLEM, 409: PROBLEM})
async def retry_job(job_id: int, service: Service) -> Job:
    """Moves a dead, cancelled or succeeded job back to pending with attempts reset."""
    return Job.model_validate(job_from_row(await service.retry(job_id)))
