"""ProducerStore: the statements of ``sql/producers.sql``, one method each."""

from __future__ import annotations

from app.domain.types import EnqueueLimits
from app.store.conn import Conn


class ProducerStore:
    """Runs the statements behind ``jobq.enqueue()``, the enqueue of producers sharing the database."""

    async def enqueue_limits_set(self, conn: Conn, *, limits: EnqueueLimits) -> None:
        """Writes the bounds and defaults ``jobq.enqueue()`` applies (unchanged ones are kept)."""
        await conn.fetch(
            "enqueue_limits_set",
            {
                "queue_name_max_chars": limits.queue_name_max_chars,
                "type_max_chars": limits.type_max_chars,
                "idempotency_key_max_chars": limits.idempotency_key_max_chars,
                "concurrency_key_max_chars": limits.concurrency_key_max_chars,
                "payload_max_bytes": limits.payload_max_bytes,
                "max_attempts_default": limits.max_attempts_default,
                "lease_seconds_default": limits.lease_seconds_default,
            },
        )
