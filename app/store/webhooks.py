"""WebhookStore: the statements of ``sql/webhooks.sql`` (deliveries and signing secrets), one method each."""

from __future__ import annotations

from datetime import datetime

from app.domain.types import DeliveryOutcome, WebhookRetryPolicy
from app.domain.webhook_records import (
    DueDelivery,
    RecordedDelivery,
    WebhookDelivery,
    WebhookSecretRow,
)
from app.store.conn import Conn


class WebhookStore:
    """Runs the webhook deliveries' statements and the keys' secret ones; callers own the transaction."""

    def __init__(self, *, instance: str | None = None) -> None:
        # This jobq instance's name, written on the history events of the attempts it makes.
        self.instance = instance

    async def webhook_delivery_take(
        self,
        conn: Conn,
        *,
        batch_size: int,
        in_flight_seconds: float,
        grace_seconds: float,
        now: datetime | None = None,
    ) -> list[DueDelivery]:
        """Leases up to ``batch_size`` due deliveries for one attempt each."""
        rows = await conn.fetch(
            "webhook_delivery_take",
            {
                "batch_size": batch_size,
                "in_flight_seconds": in_flight_seconds,
                "grace_seconds": grace_seconds,
                "now": now,
            },
        )
        return [DueDelivery.from_row(row) for row in rows]

    async def webhook_delivery_record(
        self,
        conn: Conn,
        *,
        delivery_id: str,
        attempt: int,
        outcome: DeliveryOutcome,
        status: int | None,
        error: str | None,
        policy: WebhookRetryPolicy,
        now: datetime | None = None,
    ) -> RecordedDelivery | None:
        """Records an attempt of a delivery it still leases; ``None`` when it was taken again."""
        rows = await conn.fetch(
            "webhook_delivery_record",
            {
                "id": delivery_id,
                "attempt": attempt,
                "outcome": outcome.value,
                "status": status,
                "error": error,
                "backoff_base": policy.backoff_base_seconds,
                "backoff_cap": policy.backoff_cap_seconds,
                "give_up_seconds": policy.give_up_seconds,
                "instance": self.instance,
                "now": now,
            },
        )
        return RecordedDelivery.from_row(rows[0]) if rows else None

    async def webhook_delivery_list(
        self, conn: Conn, *, job_id: int, limit: int
    ) -> list[WebhookDelivery]:
        """A job's deliveries, oldest first."""
        rows = await conn.fetch("webhook_delivery_list", {"job_id": job_id, "limit": limit})
        return [WebhookDelivery.from_row(row) for row in rows]

    async def webhook_delivery_prune(
        self, conn: Conn, *, batch_size: int, keep_seconds: float, now: datetime | None = None
    ) -> int:
        """Deletes at most ``batch_size`` delivered or failed deliveries older than ``keep_seconds``."""
        rows = await conn.fetch(
            "webhook_delivery_prune",
            {"batch_size": batch_size, "keep_seconds": keep_seconds, "now": now},
        )
        return len(rows)

    async def webhook_secret_get(
        self, conn: Conn, *, key_id: int | None, name: str | None, grace_seconds: float
    ) -> WebhookSecretRow | None:
        """A live key's webhook secrets (by id, else by name); ``None`` for no such live key."""
        rows = await conn.fetch(
            "webhook_secret_get", {"key_id": key_id, "name": name, "grace_seconds": grace_seconds}
        )
        return WebhookSecretRow.from_row(rows[0]) if rows else None

    async def webhook_secret_rotate(
        self,
        conn: Conn,
        *,
        key_id: int | None,
        name: str | None,
        secret: str,
        grace_seconds: float,
        actor: str,
        actor_key_id: int | None,
    ) -> WebhookSecretRow | None:
        """Gives a live key a new webhook secret, the current one signing on for the grace
        period; recorded in the audit trail as ``actor``'s."""
        rows = await conn.fetch(
            "webhook_secret_rotate",
            {
                "key_id": key_id,
                "name": name,
                "secret": secret,
                "grace_seconds": grace_seconds,
                "actor": actor,
                "actor_key_id": actor_key_id,
            },
        )
        return WebhookSecretRow.from_row(rows[0]) if rows else None
