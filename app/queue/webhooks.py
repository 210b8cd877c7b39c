"""Completion webhooks: the deliveries the delivery loop leases and records, and the keys' secrets.

A job with a callback gets its delivery row from a trigger, in the transaction of its finish
(migration 0020); nothing here runs on the hot path. The loop (app/maintenance/webhooks.py)
leases due deliveries, sends them and records each attempt here, one short statement each; every
attempt recorded is announced (``webhook_delivered``, ``webhook_retrying``, ``webhook_failed``)
for the metrics and the logs.
"""

from __future__ import annotations

from datetime import datetime

from app.domain.types import DeliveryOutcome, JobEvent, WebhookRetryPolicy
from app.domain.webhook_records import (
    DueDelivery,
    RecordedDelivery,
    WebhookDelivery,
    WebhookSecretRow,
)
from app.domain.webhooks import new_webhook_secret
from app.errors import NotFound
from app.queue.events import Events
from app.store import Stores
from app.store.unit import UnitOfWork

_STATE_EVENT = {
    "delivered": "webhook_delivered",
    "pending": "webhook_retrying",
    "failed": "webhook_failed",
}


class WebhookService:
    """Leases and records webhook deliveries, prunes old ones, reads and rotates keys' secrets."""

    def __init__(self, *, unit: UnitOfWork, stores: Stores, events: Events) -> None:
        self.unit = unit
        self.stores = stores
        self.events = events

    async def take(
        self,
        *,
        batch_size: int,
        in_flight_seconds: float,
        grace_seconds: float,
        now: datetime | None = None,
    ) -> list[DueDelivery]:
        """Leases up to ``batch_size`` due deliveries for one attempt each (committed at once)."""
        async for attempt in self.unit.ops():
            async with attempt as conn:
                due = await self.stores.webhooks.webhook_delivery_take(
                    conn,
                    batch_size=batch_size,
                    in_flight_seconds=in_flight_seconds,
                    grace_seconds=grace_seconds,
                    now=now,
                )
        return due

    async def record(
        self,
        delivery: DueDelivery,
        *,
        outcome: DeliveryOutcome,
        status: int | None,
        error: str | None,
        policy: WebhookRetryPolicy,
        now: datetime | None = None,
    ) -> RecordedDelivery | None:
        """Records one attempt of a leased delivery and appends it to the job's history;
        ``None`` (nothing recorded) when another sender took the delivery again meanwhile."""
        async for attempt in self.unit.ops():
            async with attempt as conn:
                recorded = await self.stores.webhooks.webhook_delivery_record(
                    conn,
                    delivery_id=str(delivery.id),
                    attempt=delivery.attempts,
                    outcome=outcome,
                    status=status,
                    error=error,
                    policy=policy,
                    now=now,
                )
        if recorded is not None:
            self.events.publish(
                [
                    JobEvent(
                        _STATE_EVENT[recorded.state],
                        recorded.job_id,
                        recorded.queue or "",
                        type=recorded.type,
                        attempt=recorded.attempts,
                    )
                ]
            )
        return recorded

    async def deliveries(self, job_id: int, *, limit: int = 100) -> list[WebhookDelivery]:
        """A job's deliveries, oldest first."""
        async for attempt in self.unit.ops():
            async with attempt as conn:
                rows = await self.stores.webhooks.webhook_delivery_list(
                    conn, job_id=job_id, limit=limit
                )
        return rows

    async def prune(
        self, *, batch_size: int, keep_seconds: float, now: datetime | None = None
    ) -> int:
        """Deletes at most ``batch_size`` delivered or failed deliveries past ``keep_seconds``."""
        async for attempt in self.unit.ops():
            async with attempt as conn:
                pruned = await self.stores.webhooks.webhook_delivery_prune(
                    conn, batch_size=batch_size, keep_seconds=keep_seconds, now=now
                )
        return pruned

    async def secret(
        self, *, key_id: int | None = None, name: str | None = None, grace_seconds: float
    ) -> WebhookSecretRow:
        """A live key's webhook secret (by id, else by name); ``NotFound`` for no such key."""
        async for attempt in self.unit.ops():
            async with attempt as conn:
                row = await self.stores.webhooks.webhook_secret_get(
                    conn, key_id=key_id, name=name, grace_seconds=grace_seconds
                )
        if row is None:
            raise NotFound(f"no live API key {name or key_id}")
        return row

    async def rotate_secret(
        self,
        *,
        key_id: int | None = None,
        name: str | None = None,
        grace_seconds: float,
        actor: str,
        actor_key_id: int | None,
    ) -> WebhookSecretRow:
        """Gives a live key a new webhook secret; the previous one signs on for ``grace_seconds``.
        Recorded in the audit trail as ``actor``'s."""
        async for attempt in self.unit.ops():
            async with attempt as conn:
                row = await self.stores.webhooks.webhook_secret_rotate(
                    conn,
                    key_id=key_id,
                    name=name,
                    secret=new_webhook_secret(),
                    grace_seconds=grace_seconds,
                    actor=actor,
                    actor_key_id=actor_key_id,
                )
        if row is None:
            raise NotFound(f"no live API key {name or key_id}")
        return row
