"""Wire rules and models of completion webhooks: the callback_url field, the signing secret."""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from datetime import datetime
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, Field, StringConstraints

from app.auth.keys import Principal
from app.domain.webhooks import AddressPolicy, callback_url_problem, parse_networks
from app.errors import InvalidInput
from app.settings import Settings


def address_policy(settings: Settings) -> AddressPolicy:
    """The address policy these settings give (``JOBQ_WEBHOOK_ALLOWED_NETWORKS``)."""
    return AddressPolicy(parse_networks(settings.webhook_allowed_networks))


def callback_url_type(settings: Settings) -> object:
    """The ``callback_url`` field's type for these settings: an absolute http(s) URL within the
    length limit whose host, when written as an address (or named localhost), the policy allows."""
    policy = address_policy(settings)
    max_chars = settings.webhook_url_max_chars

    def check(url: str) -> str:
        problem = callback_url_problem(url, max_chars=max_chars, policy=policy)
        if problem is not None:
            raise ValueError(problem)
        return url

    return Annotated[
        str,
        StringConstraints(min_length=1, max_length=max_chars),
        AfterValidator(check),
        Field(
            description="An absolute http(s) URL, at most "
            f"{max_chars} characters; loopback, private and other special addresses are "
            "refused unless JOBQ_WEBHOOK_ALLOWED_NETWORKS allows them."
        ),
    ]


def require_signing(
    settings: Settings, caller: Principal, fields: Iterable[tuple[str, str | None]]
) -> None:
    """Refuses callbacks nothing could sign: authentication off and no ``JOBQ_WEBHOOK_SECRET``.

    ``fields`` are (field name, callback_url) pairs; with a key, the key's own secret signs.
    """
    if caller.key_id is not None or settings.webhook_secret is not None:
        return
    named = [name for name, url in fields if url is not None]
    if named:
        message = (
            "no signing secret: set JOBQ_WEBHOOK_SECRET, or enqueue with an API key (each "
            "key's webhook secret signs its jobs' callbacks)"
        )
        raise InvalidInput(
            f"callback_url refused: {message}",
            errors=[{"field": name, "message": message} for name in named],
        )


class WebhookSecret(BaseModel):
    """The secret that signs the webhooks of the calling key's jobs."""

    key_name: str
    secret: str = Field(
        description="HMAC-SHA256 key of the Jobq-Signature header's v1 values; keep it secret."
    )
    previous_secret: str | None = Field(
        default=None,
        description="After a rotation, the previous secret, which also signs (a second v1) "
        "until previous_valid_until.",
    )
    previous_valid_until: datetime | None = None
    rotated_at: datetime | None = None


class WebhookDeliveryInfo(BaseModel):
    """One delivery of a job's outcome to its callback (a finish, and a later one after a retry)."""

    id: uuid.UUID = Field(description="The delivery id: the Jobq-Delivery-Id header.")
    job_id: int
    url: str
    state: Literal["pending", "delivered", "failed"]
    attempts: int
    next_attempt_at: datetime = Field(description="When a pending delivery is tried next.")
    last_status: int | None = Field(description="The HTTP status of the last attempt's answer.")
    last_error: str | None
    created_at: datetime = Field(description="The job's finish that made this delivery.")
    delivered_at: datetime | None
    updated_at: datetime


class WebhookDeliveryList(BaseModel):
    """A job's deliveries, oldest first."""

    deliveries: list[WebhookDeliveryInfo]
