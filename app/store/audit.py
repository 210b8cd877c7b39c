"""AuditStore: the statements of ``sql/audit.sql`` and the audit listing builder."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from app.domain.records import AuditEntry
from app.domain.types import AuditFilter
from app.store.conn import Conn, to_json
from app.store.listing import audit_list_query


class AuditStore:
    """Writes and lists the audit trail, in the caller's transaction."""

    async def audit_insert(
        self,
        conn: Conn,
        *,
        actor: str,
        actor_key_id: int | None,
        action: str,
        outcome: str,
        queue: str | None = None,
        job_id: int | None = None,
        state_before: str | None = None,
        state_after: str | None = None,
        detail: Mapping[str, Any] | None = None,
    ) -> None:
        """Records one admin action in the audit trail (in the caller's transaction)."""
        await conn.fetch(
            "audit_insert",
            {
                "actor": actor,
                "actor_key_id": actor_key_id,
                "action": action,
                "outcome": outcome,
                "queue": queue,
                "job_id": job_id,
                "state_before": state_before,
                "state_after": state_after,
                "detail": to_json(detail) if detail is not None else None,
            },
        )

    async def audit_insert_key(
        self,
        conn: Conn,
        *,
        actor: str,
        action: str,
        outcome: str,
        key_name: str,
        state_before: str | None = None,
        state_after: str | None = None,
        detail: Mapping[str, Any] | None = None,
    ) -> None:
        """Records one key operation in the audit trail under the key's name."""
        await conn.fetch(
            "audit_insert_key",
            {
                "actor": actor,
                "action": action,
                "outcome": outcome,
                "key_name": key_name,
                "state_before": state_before,
                "state_after": state_after,
                # None as JSON null, not SQL NULL: what these rows have always held.
                "detail": to_json(detail),
            },
        )

    async def audit_list(self, conn: Conn, *, where: AuditFilter) -> list[AuditEntry]:
        """A page of audit entries, newest first, after the keyset position ``before_id``."""
        return [AuditEntry.from_row(row) for row in await conn.fetch_query(audit_list_query(where))]
