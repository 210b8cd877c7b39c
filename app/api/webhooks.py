"""Completion webhooks: a key's signing secret (read, rotate) and a job's deliveries."""

# No ``from __future__ import annotations``: FastAPI reads the annotations at runtime.

from dataclasses import asdict
from typing import Annotated

from fastapi import APIRouter, Path

from app.api.auth import allow_queue, requires
from app.api.deps import Services
from app.api.webhook_models import WebhookDeliveryInfo, WebhookDeliveryList, WebhookSecret
from app.auth.keys import Permission, Principal
from app.domain.bounds import MAX_BIGINT
from app.errors import PROBLEM, InvalidTransition
from app.http.strict_json import StrictJSONRoute
from app.settings import Settings

Producer = Annotated[Principal, requires(Permission.ENQUEUE)]
Reader = Annotated[Principal, requires(Permission.READ_JOBS)]

# A job is delivered once per finish; more than this many finishes are not listed.
DELIVERIES_LISTED_MAX = 100


def _keyed(caller: Principal) -> int:
    if caller.key_id is None:
        raise InvalidTransition(
            "authentication is off: callbacks are signed with JOBQ_WEBHOOK_SECRET, set in the "
            "service's environment; each API key has a secret of its own once keys exist"
        )
    return caller.key_id


def build_router(settings: Settings) -> APIRouter:
    """The webhook routes."""
    router = APIRouter(prefix="/v1", tags=["webhooks"], route_class=StrictJSONRoute)
    grace = settings.webhook_secret_grace_seconds

    @router.get("/webhooks/secret", response_model=WebhookSecret, responses={409: PROBLEM})
    async def webhook_secret(caller: Producer, services: Services) -> WebhookSecret:
        """The secret that signs the webhooks of the jobs the calling key enqueues (its
        ``Jobq-Signature`` v1 values), and after a rotation the previous one while it still
        signs. 409 without authentication (JOBQ_WEBHOOK_SECRET signs then)."""
        row = await services.webhooks.secret(key_id=_keyed(caller), grace_seconds=grace)
        return WebhookSecret.model_validate(asdict(row))

    @router.post("/webhooks/secret/rotate", response_model=WebhookSecret, responses={409: PROBLEM})
    async def rotate_webhook_secret(caller: Producer, services: Services) -> WebhookSecret:
        """Gives the calling key a new webhook secret. Deliveries from now on carry two ``v1``
        signatures, the new secret's and the previous one's, until ``previous_valid_until``
        (JOBQ_WEBHOOK_SECRET_GRACE_SECONDS): switch the receiver over within that time. A second
        rotation within it drops the first previous secret."""
        row = await services.webhooks.rotate_secret(
            key_id=_keyed(caller),
            grace_seconds=grace,
            actor=caller.name,
            actor_key_id=caller.key_id,
        )
        return WebhookSecret.model_validate(asdict(row))

    @router.get(
        "/jobs/{job_id}/webhooks",
        response_model=WebhookDeliveryList,
        responses={403: PROBLEM, 404: PROBLEM},
    )
    async def job_webhooks(
        caller: Reader,
        services: Services,
        job_id: Annotated[int, Path(ge=1, le=MAX_BIGINT)],
    ) -> WebhookDeliveryList:
        """The deliveries of a job's outcome to its callback, oldest first: one per finish
        (a job retried and finished again is delivered again), each with its state, attempts,
        next attempt and last answer or error. Each attempt is in the job's history too."""
        job = await services.jobs.get(job_id)
        allow_queue(caller, job.queue, field="path.job_id")
        rows = await services.webhooks.deliveries(job_id, limit=DELIVERIES_LISTED_MAX)
        return WebhookDeliveryList(
            deliveries=[WebhookDeliveryInfo.model_validate(asdict(r)) for r in rows]
        )

    return router
