"""Worker endpoints: claim leases, then heartbeat / complete / fail / release them, per item."""

# No ``from __future__ import annotations`` here: the endpoints are annotated with request models
# built for the app's settings inside build_router, which FastAPI must see as classes.

import contextlib
import json
from collections.abc import Awaitable, Sequence
from typing import Annotated, Any, Protocol

from fastapi import APIRouter, Request, Response
from pydantic import AfterValidator, Field, JsonValue

from app.api import lease_models as lease
from app.api import schemas as wire
from app.api.auth import allow_queues, requires
from app.api.deps import Services
from app.api.lease_models import ClaimResponse, LeaseResults, SettleResults
from app.api.render import claimed, json_response, lease_results_response, settle_response
from app.api.schemas import TraceParent, json_size_at_most
from app.auth.keys import Permission, Principal
from app.domain.fingerprints import failure_fingerprint
from app.domain.types import NOT_GIVEN, ClaimAsk, LeaseOutcome, LeaseTransition, LeaseUpdate
from app.errors import PROBLEM
from app.http import tracing
from app.http.disconnect import client_gone
from app.http.lean import LeanRoute
from app.queue.services import Services as AppServices
from app.settings import Settings


def _items(
    leases: Sequence[lease.LeaseRef], worker_id: str, key_id: int | None
) -> list[LeaseUpdate]:
    """The leases of a call as the core's updates, each owned by the calling worker and key."""
    return [_update(item, worker_id, key_id) for item in leases]


def _update(item: lease.LeaseRef, worker_id: str, key_id: int | None) -> LeaseUpdate:
    """One lease item as the core's update: a field the request left out is ``NOT_GIVEN`` (an
    absent checkpoint keeps the stored one), a JSON null is ``None`` (it clears it)."""
    given = item.model_fields_set

    def sent(name: str) -> Any:
        return getattr(item, name) if name in given else NOT_GIVEN

    job_id, lease_id = item.job_id, str(item.lease_id)
    owner: dict[str, Any] = {"worker_id": worker_id, "key_id": key_id}
    if isinstance(item, lease.HeartbeatItem):
        return LeaseUpdate(
            job_id=job_id,
            lease_id=lease_id,
            **owner,
            lease_seconds=item.lease_seconds,
            checkpoint=sent("checkpoint"),
            progress=sent("progress"),
        )
    if isinstance(item, lease.CompleteItem):
        return LeaseUpdate(job_id=job_id, lease_id=lease_id, result=item.result, **owner)
    if isinstance(item, lease.FailItem):
        error = item.error
        detail = None if isinstance(error, str) else error
        traceback = detail.traceback if detail is not None else None
        return LeaseUpdate(
            job_id=job_id,
            lease_id=lease_id,
            **owner,
            error=detail.message if detail is not None else str(error),
            error_type=detail.type if detail is not None else None,
            traceback=traceback,
            # Here, before the call takes a connection: a pure scan of the text.
            fingerprint=failure_fingerprint(traceback),
            retryable=item.retryable,
            retry_after_seconds=item.retry_after_seconds,
            checkpoint=sent("checkpoint"),
        )
    if isinstance(item, lease.ReleaseItem):
        return LeaseUpdate(
            job_id=job_id,
            lease_id=lease_id,
            **owner,
            delay_seconds=item.delay_seconds,
            checkpoint=sent("checkpoint"),
        )
    raise TypeError(f"not a lease item: {type(item).__name__}")


Worker = Annotated[Principal, requires(Permission.WORK)]


class _LeaseCall(Protocol):
    """A lease transition of the jobs service (heartbeat, complete, fail, release)."""

    def __call__(
        self, *, worker_id: str, items: Sequence[LeaseUpdate], key_id: int | None = None
    ) -> Awaitable[list[LeaseOutcome]]: ...


async def _lease_call(
    operation: str,
    transition: _LeaseCall,
    worker: Principal,
    worker_id: str,
    leases: Sequence[lease.LeaseRef],
    traceparent: str | None,
) -> Response:
    """One lease call, in its span: a child of the worker's (its handler's) span when it sends one."""
    with tracing.span(
        operation,
        "CLIENT",
        traceparent=tracing.valid_traceparent(traceparent),
        operation_type=None if operation == "heartbeat" else "settle",
    ) as span:
        span.messages([item.job_id for item in leases])
        outcomes = await transition(
            worker_id=worker_id,
            key_id=worker.key_id,
            items=_items(leases, worker_id, worker.key_id),
        )
        span.destination(o.queue for o in outcomes)
    return lease_results_response(outcomes)


async def _settle_call(
    transition: LeaseTransition,
    worker: Principal,
    body: lease.CompleteRequest | lease.FailRequest | lease.ReleaseRequest,
    services: AppServices,
    request: Request,
    traceparent: str | None,
) -> Response:
    """A complete, fail or release; with ``claim_next``, then a claim for the same worker
    (app/queue/chained.py says when the two share a transaction)."""
    jobs = services.jobs
    ask = body.claim_next
    if ask is None:
        call = {
            LeaseTransition.COMPLETE: jobs.complete,
            LeaseTransition.FAIL: jobs.fail,
            LeaseTransition.RELEASE: jobs.release,
        }[transition]
        return await _lease_call(
            transition.value, call, worker, body.worker_id, body.leases, traceparent
        )
    # Before anything is done: a key that may not claim there changes nothing with this call.
    allow_queues(worker, ask.queues, field="body.claim_next.queues")
    services.workers.seen(body.worker_id, worker.key_id, ask.queues)
    async with contextlib.AsyncExitStack() as stack:
        span = stack.enter_context(
            tracing.span(
                transition.value,
                "CLIENT",
                traceparent=tracing.valid_traceparent(traceparent),
                operation_type="settle",
            )
        )
        span.messages([item.job_id for item in body.leases])
        # The claim's span, a child of the call's: the two share one transaction.
        receive = stack.enter_context(
            tracing.span(
                "claim", "CLIENT", traceparent=None, queues=ask.queues, operation_type="receive"
            )
        )
        # Only a claim that may wait needs to notice the client leaving.
        gone = await stack.enter_async_context(client_gone(request)) if ask.wait_seconds else None
        done = await services.chained.settle_and_claim(
            transition,
            worker_id=body.worker_id,
            key_id=worker.key_id,
            items=_items(body.leases, body.worker_id, worker.key_id),
            ask=ClaimAsk(
                queues=tuple(ask.queues),
                max_jobs=ask.max_jobs,
                lease_seconds=ask.lease_seconds,
                wait_seconds=ask.wait_seconds,
            ),
            stop=gone,
            queue_patterns=worker.like_patterns(),
        )
        receive.messages([r.id for r in done.claimed])
        receive.link([r.traceparent for r in done.claimed])
        span.destination(o.queue for o in done.outcomes)
    problem = None if done.claim_error is None else await _problem(request, done.claim_error)
    return settle_response(done.outcomes, done.claimed, problem)


async def _problem(request: Request, error: Exception) -> dict[str, Any]:
    """The problem+json body the app answers for ``error`` (as POST /v1/claim would have)."""
    handlers = request.app.exception_handlers
    handler = next(handlers[kind] for kind in type(error).__mro__ if kind in handlers)
    response = await handler(request, error)
    problem: dict[str, Any] = json.loads(response.body)
    return problem


def build_router(settings: Settings) -> APIRouter:
    """The worker routes, validating against this app's limits (and documenting them)."""
    router = APIRouter(prefix="/v1", tags=["workers"], route_class=LeanRoute)
    per_call = settings.lease_batch_max
    checkpoint_bytes = settings.checkpoint_max_bytes
    Checkpoint = Annotated[
        JsonValue,
        AfterValidator(json_size_at_most(checkpoint_bytes)),
        Field(description=f"Any JSON, at most {checkpoint_bytes} bytes; saved under the lease."),
    ]
    Progress = Annotated[
        JsonValue,
        AfterValidator(json_size_at_most(settings.progress_max_bytes)),
        Field(
            description=f"Any JSON, at most {settings.progress_max_bytes} bytes, "
            'e.g. {"done": 8, "total": 20}.'
        ),
    ]

    WorkerId = Annotated[str, wire.at_most(settings.worker_id_max_chars)]
    queue_max = settings.queue_name_max_chars
    Queue = Annotated[str, wire.queue_name_rule(queue_max), wire.queue_name_doc(queue_max)]

    # Named as on the wire: OpenAPI names its components after these classes.
    class ClaimNext(lease.ClaimNext):
        __doc__ = lease.ClaimNext.__doc__
        queues: list[Queue] = Field(min_length=1, max_length=settings.claim_max_queues)
        max_jobs: int = Field(default=1, ge=1, le=settings.claim_max_jobs)
        wait_seconds: float = Field(
            default=0,
            ge=0,
            le=settings.longpoll_max_wait_seconds,
            allow_inf_nan=False,
            description="Long-poll up to this long when nothing is due.",
        )

    class ClaimRequest(ClaimNext, lease.ClaimRequest):
        __doc__ = lease.ClaimRequest.__doc__
        worker_id: WorkerId

    NextClaim = Annotated[
        ClaimNext | None,
        Field(description="Then claim the worker's next jobs in the same call (SettleResults)."),
    ]

    class HeartbeatItem(lease.HeartbeatItem):
        __doc__ = lease.HeartbeatItem.__doc__
        checkpoint: Checkpoint = None
        progress: Progress = None

    class FailItem(lease.FailItem):
        __doc__ = lease.FailItem.__doc__
        checkpoint: Checkpoint = None

    class ReleaseItem(lease.ReleaseItem):
        __doc__ = lease.ReleaseItem.__doc__
        checkpoint: Checkpoint = None

    class HeartbeatRequest(lease.HeartbeatRequest):
        __doc__ = lease.HeartbeatRequest.__doc__
        worker_id: WorkerId
        leases: Sequence[HeartbeatItem] = Field(min_length=1, max_length=per_call)

    class CompleteRequest(lease.CompleteRequest):
        __doc__ = lease.CompleteRequest.__doc__
        worker_id: WorkerId
        leases: Sequence[lease.CompleteItem] = Field(min_length=1, max_length=per_call)
        claim_next: NextClaim = None

    class FailRequest(lease.FailRequest):
        __doc__ = lease.FailRequest.__doc__
        worker_id: WorkerId
        leases: Sequence[FailItem] = Field(min_length=1, max_length=per_call)
        claim_next: NextClaim = None

    class ReleaseRequest(lease.ReleaseRequest):
        __doc__ = lease.ReleaseRequest.__doc__
        worker_id: WorkerId
        leases: Sequence[ReleaseItem] = Field(min_length=1, max_length=per_call)
        claim_next: NextClaim = None

    @router.post("/claim", response_model=ClaimResponse, responses={422: PROBLEM})
    async def claim(
        worker: Worker,
        body: ClaimRequest,
        services: Services,
        request: Request,
        traceparent: TraceParent = None,
    ) -> Response:
        """Leases up to ``max_jobs`` due jobs; each comes with ``lease_id``, ``attempt`` and ``checkpoint``.

        With ``wait_seconds`` > 0 the call long-polls: it answers as soon as a job it can take
        exists, or with an empty list when the wait ends (or the instance shuts down).
        The leases belong to ``worker_id`` within the caller's API key: only the same worker of
        the same key can heartbeat, complete, fail or release them.
        """
        allow_queues(worker, body.queues, field="body.queues")
        # Seen, live, long-polling or not (written every few seconds, not by this request).
        services.workers.seen(body.worker_id, worker.key_id, body.queues)
        async with contextlib.AsyncExitStack() as stack:
            span = stack.enter_context(
                tracing.span(
                    "claim",
                    "CLIENT",
                    traceparent=tracing.valid_traceparent(traceparent),
                    queues=body.queues,
                    operation_type="receive",
                )
            )
            # Only a claim that may wait needs to notice the client leaving.
            gone = (
                await stack.enter_async_context(client_gone(request)) if body.wait_seconds else None
            )
            rows = await services.jobs.claim(
                worker_id=body.worker_id,
                queues=body.queues,
                max_jobs=body.max_jobs,
                lease_seconds=body.lease_seconds,
                wait_seconds=body.wait_seconds,
                stop=gone,
                key_id=worker.key_id,
                queue_patterns=worker.like_patterns(),
            )
            span.messages([r.id for r in rows])
            span.link([r.traceparent for r in rows])
        return json_response({"jobs": [claimed(r) for r in rows]})

    @router.post("/heartbeat", response_model=LeaseResults, responses={422: PROBLEM})
    async def heartbeat(
        worker: Worker, body: HeartbeatRequest, services: Services, traceparent: TraceParent = None
    ) -> Response:
        """Extends leases, saving checkpoint and progress under the ownership check."""
        return await _lease_call(
            "heartbeat", services.jobs.heartbeat, worker, body.worker_id, body.leases, traceparent
        )

    @router.post("/complete", response_model=SettleResults, responses={422: PROBLEM})
    async def complete(
        worker: Worker,
        body: CompleteRequest,
        services: Services,
        request: Request,
        traceparent: TraceParent = None,
    ) -> Response:
        """Completes held jobs; a repeated complete with the same lease answers the same success."""
        return await _settle_call(
            LeaseTransition.COMPLETE, worker, body, services, request, traceparent
        )

    @router.post("/fail", response_model=SettleResults, responses={422: PROBLEM})
    async def fail(
        worker: Worker,
        body: FailRequest,
        services: Services,
        request: Request,
        traceparent: TraceParent = None,
    ) -> Response:
        """Fails attempts: retried after backoff (or ``retry_after_seconds``), or dead."""
        return await _settle_call(
            LeaseTransition.FAIL, worker, body, services, request, traceparent
        )

    @router.post("/release", response_model=SettleResults, responses={422: PROBLEM})
    async def release(
        worker: Worker,
        body: ReleaseRequest,
        services: Services,
        request: Request,
        traceparent: TraceParent = None,
    ) -> Response:
        """Gives held jobs back to pending without charging the attempt, keeping the checkpoint."""
        return await _settle_call(
            LeaseTransition.RELEASE, worker, body, services, request, traceparent
        )

    return router
