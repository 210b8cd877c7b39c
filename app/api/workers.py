"""Worker endpoints: claim leases, then heartbeat / complete / fail / release them, per item."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence

from fastapi import APIRouter, Request

from app.api.deps import Service
from app.api.strict_json import StrictJSONRoute
from app.errors import PROBLEM
from app.queue.repository import LeaseOutcome
from app.schemas import (
    ClaimedJob,
    ClaimRequest,
    ClaimResponse,
    CompleteRequest,
    FailRequest,
    HeartbeatRequest,
    LeaseResult,
    LeaseResults,
    ReleaseRequest,
    StrictModel,
    job_from_row,
)

router = APIRouter(prefix="/v1", tags=["workers"], route_class=StrictJSONRoute)


def _results(outcomes: Sequence[LeaseOutcome]) -> LeaseResults:
    return LeaseResults(
        results=[
            LeaseResult(
                job_id=o.job_id,
                ok=o.ok,
                status=o.status,
                error=None if o.ok else "lease_lost",
                cancelled=o.cancelled,
                timed_out=o.timed_out,
                lease_expires_at=o.lease_expires_at,
                run_at=o.run_at,
            )
            for o in outcomes
        ]
    )


def _items(leases: Sequence[StrictModel]) -> list[dict[str, object]]:
    # exclude_unset: an absent checkpoint keeps the stored one, an explicit null clears it.
    return [item.model_dump(mode="json", exclude_unset=True) for item in leases]


@contextlib.asynccontextmanager
async def _client_gone(request: Request) -> AsyncIterator[asyncio.Event]:
    """An event set when the HTTP client disconnects (watched only for the span of the block)."""
    gone = asyncio.Event()

    async def watch() -> None:
        # The body was read already: the next message is the disconnect (or the end of the cycle).
        while (await request.receive())["type"] != "http.disconnect":
            pass
        gone.set()

    watcher = asyncio.create_task(watch(), name="jobq-claim-disconnect")
    try:
        yield gone
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher


@router.post("/claim", response_model=ClaimResponse, responses={422: PROBLEM})
async def claim(body: ClaimRequest, service: Service, request: Request) -> ClaimResponse:
    """Leases up to ``max_jobs`` due jobs; each comes with ``lease_id``, ``attempt`` and ``checkpoint``.

    With ``wait_seconds`` > 0 the call long-polls: it answers as soon as a job it can take
    exists, or with an empty list when the wait ends (or the instance shuts down).
    """
    async with contextlib.AsyncExitStack() as stack:
        # Only a claim that may wait needs to notice the client leaving.
        gone = await stack.enter_async_context(_client_gone(request)) if body.wait_seconds else None
        rows = await service.claim(
            worker_id=body.worker_id,
            queues=body.queues,
            max_jobs=body.max_jobs,
            lease_seconds=body.lease_seconds,
            wait_seconds=body.wait_seconds,
            stop=gone,
        )
    return ClaimResponse(
        jobs=[
            ClaimedJob.model_validate({**job_from_row(r), "attempt": r["attempts"]}) for r in rows
        ]
    )


@router.post("/heartbeat", response_model=LeaseResults, responses={422: PROBLEM})
async def heartbeat(body: HeartbeatRequest, service: Service) -> LeaseResults:
    """Extends leases, saving checkpoint and progress under the ownership check."""
    return _results(
        await service.lease_call(
            service.repo.job_heartbeat, worker_id=body.worker_id, items=_items(body.leases)
        )
    )


@router.post("/complete", response_model=LeaseResults, responses={422: PROBLEM})
async def complete(body: CompleteRequest, service: Service) -> LeaseResults:
    """Completes held jobs; a repeat with the same lease answers the same success."""
    return _results(
        await service.lease_call(
            service.repo.job_complete, worker_id=body.worker_id, items=_items(body.leases)
        )
    )


@router.post("/fail", response_model=LeaseResults, responses={422: PROBLEM})
async def fail(body: FailRequest, service: Service) -> LeaseResults:
    """Fails attempts: retried after backoff (or ``retry_after_seconds``), or dead."""
    return _results(
        await service.lease_call(
            service.repo.job_fail, worker_id=body.worker_id, items=_items(body.leases)
        )
    )


@router.post("/release", response_model=LeaseResults, responses={422: PROBLEM})
async def release(body: ReleaseRequest, service: Service) -> LeaseResults:
    """Gives held jobs back to pending without charging the attempt, keeping the checkpoint."""
    return _results(
        await service.lease_call(
            service.repo.job_release, worker_id=body.worker_id, items=_items(body.leases)
        )
    )
