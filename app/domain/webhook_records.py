"""Typed rows of completion webhooks: deliveries as leased, recorded and listed, keys' secrets."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from app.domain.records import Record


@dataclass(slots=True)
class DueDelivery(Record):
    """A webhook delivery leased for one attempt: where it goes, what it says, who signs it."""

    id: Any
    job_id: int
    url: str
    key_id: int | None
    body: str  # the outcome as JSON text, sent and signed byte for byte
    attempts: int  # this attempt's number
    created_at: datetime
    taken_at: datetime  # the database's clock when leased: the signature's timestamp
    secret: str | None  # the enqueuing key's; None for jobs enqueued without a key
    previous_secret: str | None  # the key's previous one, within a rotation's grace period


@dataclass(slots=True)
class RecordedDelivery(Record):
    """A delivery after one recorded attempt: pending (to retry), delivered or failed."""

    id: Any
    job_id: int
    state: str
    attempts: int
    next_attempt_at: datetime
    queue: str | None
    type: str | None


@dataclass(slots=True)
class WebhookDelivery(Record):
    """One delivery of a job's outcome, as a job's listing of them shows it."""

    id: Any
    job_id: int
    url: str
    state: str
    attempts: int
    next_attempt_at: datetime
    last_status: int | None
    last_error: str | None
    created_at: datetime
    delivered_at: datetime | None
    updated_at: datetime


@dataclass(slots=True)
class WebhookSecretRow(Record):
    """A key's webhook secret, and its previous one while a rotation's grace period lasts."""

    key_id: int
    key_name: str
    secret: str
    previous_secret: str | None
    previous_valid_until: datetime | None
    rotated_at: datetime | None
