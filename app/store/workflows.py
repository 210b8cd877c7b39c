"""WorkflowStore: the statements of ``sql/workflows.sql``, one method each."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from app.domain.records import Job
from app.domain.workflow_records import ParentOutcome, StepMoved, Workflow
from app.store.conn import Conn, to_json


class WorkflowStore:
    """Runs the statements that create, read, cancel and retry job graphs (migration 0021)."""

    async def job_ids_reserve(self, conn: Conn, *, n: int) -> list[int]:
        """``n`` new job ids, in order."""
        return [int(row["id"]) for row in await conn.fetch("job_ids_reserve", {"n": n})]

    async def job_parents_found(self, conn: Conn, *, ids: Sequence[int]) -> dict[int, str]:
        """The queue of each of ``ids`` that exists."""
        rows = await conn.fetch("job_parents_found", {"ids": list(ids)})
        return {int(row["id"]): str(row["queue"]) for row in rows}

    async def job_parent_outcomes(
        self,
        conn: Conn,
        *,
        ids: Sequence[int],
        inline_bytes: int,
        total_bytes: int,
        queue_patterns: Sequence[str] | None = None,
    ) -> list[ParentOutcome]:
        """The parents of each of ``ids`` with their states, results inline while they fit;
        a parent outside ``queue_patterns`` (SQL LIKE; ``None``: every queue) is hidden."""
        rows = await conn.fetch(
            "job_parent_outcomes",
            {
                "ids": list(ids),
                "inline_bytes": inline_bytes,
                "total_bytes": total_bytes,
                "queue_patterns": list(queue_patterns) if queue_patterns is not None else None,
            },
        )
        return [ParentOutcome.from_row(row) for row in rows]

    async def job_parent_results(self, conn: Conn, *, ids: Sequence[int]) -> dict[int, Any]:
        """The result of each of ``ids`` that exists."""
        rows = await conn.fetch("job_parent_results", {"ids": list(ids)})
        return {int(row["id"]): row["result"] for row in rows}

    async def workflow_create(
        self,
        conn: Conn,
        *,
        name: str,
        steps: int,
        actor: str | None,
        actor_key_id: int | None,
        idempotency_key: str | None = None,
        idempotency_hash: str | None = None,
    ) -> Workflow | None:
        """Records a workflow (its steps are enqueued next in the same transaction); ``None``
        when another workflow holds ``idempotency_key``."""
        rows = await conn.fetch(
            "workflow_create",
            {
                "name": name,
                "steps": steps,
                "actor": actor,
                "actor_key_id": actor_key_id,
                "idempotency_key": idempotency_key,
                "idempotency_hash": idempotency_hash,
            },
        )
        return Workflow.from_row(rows[0]) if rows else None

    async def workflow_get_by_idempotency_key(
        self, conn: Conn, *, idempotency_key: str
    ) -> Workflow | None:
        """The workflow holding ``idempotency_key``, or ``None``."""
        rows = await conn.fetch(
            "workflow_get_by_idempotency_key", {"idempotency_key": idempotency_key}
        )
        return Workflow.from_row(rows[0]) if rows else None

    async def workflow_get(self, conn: Conn, *, workflow_id: int) -> Workflow | None:
        """One workflow, or ``None``."""
        rows = await conn.fetch("workflow_get", {"id": workflow_id})
        return Workflow.from_row(rows[0]) if rows else None

    async def workflow_steps(self, conn: Conn, *, workflow_id: int) -> list[Job]:
        """A workflow's jobs in creation order."""
        return [
            Job.from_row(row) for row in await conn.fetch("workflow_steps", {"id": workflow_id})
        ]

    async def workflow_lock(self, conn: Conn, *, workflow_id: int) -> None:
        """Locks the workflow's steps (in a transaction), waiting for finishes in flight."""
        await conn.fetch("workflow_lock", {"id": workflow_id})

    async def workflow_cancel(
        self, conn: Conn, *, workflow_id: int, actor: str, actor_key_id: int | None
    ) -> list[StepMoved]:
        """Cancels the workflow's open steps; answers them."""
        rows = await conn.fetch(
            "workflow_cancel", {"id": workflow_id, "actor": actor, "actor_key_id": actor_key_id}
        )
        return [StepMoved.from_row(row) for row in rows]

    async def workflow_retry(
        self, conn: Conn, *, workflow_id: int, actor: str, actor_key_id: int | None
    ) -> list[StepMoved]:
        """Puts the workflow's dead and cancelled steps back (pending or waiting); answers them."""
        rows = await conn.fetch(
            "workflow_retry", {"id": workflow_id, "actor": actor, "actor_key_id": actor_key_id}
        )
        return [StepMoved.from_row(row) for row in rows]

    async def ordering_keys_lock(self, conn: Conn, *, keys: Sequence[tuple[str, str]]) -> None:
        """Locks the (queue, ordering key) rows in key order, making missing ones (a transaction)."""
        payload = [{"queue": q, "ordering_key": k} for q, k in keys]
        await conn.fetch("ordering_keys_lock", {"keys": to_json(payload)})

    async def ordering_key_unstick(
        self,
        conn: Conn,
        *,
        keys: Sequence[tuple[str, str]] | None,
        recent_seconds: float = 0.0,
    ) -> list[tuple[int, str, str]]:
        """Makes the oldest waiting job of each key due where nothing of the key is open (the
        given keys, or those enqueued to in the last ``recent_seconds``); answers (id, queue,
        status) of each job moved."""
        payload = (
            None if keys is None else to_json([{"queue": q, "ordering_key": k} for q, k in keys])
        )
        rows = await conn.fetch(
            "ordering_key_unstick", {"keys": payload, "recent_seconds": recent_seconds}
        )
        return [(int(r["id"]), str(r["queue"]), str(r["status"])) for r in rows]

    async def workflow_prune(
        self,
        conn: Conn,
        *,
        older_than_seconds: float,
        batch_size: int,
        now: datetime | None = None,
    ) -> int:
        """Deletes up to ``batch_size`` old workflows whose steps are all gone; answers how many."""
        rows = await conn.fetch(
            "workflow_prune",
            {"older_than_seconds": older_than_seconds, "batch_size": batch_size, "now": now},
        )
        return len(rows)

    async def ordering_key_prune(
        self,
        conn: Conn,
        *,
        older_than_seconds: float,
        batch_size: int,
        now: datetime | None = None,
    ) -> int:
        """Deletes up to ``batch_size`` idle ordering-key rows with no open job; answers how many."""
        rows = await conn.fetch(
            "ordering_key_prune",
            {"older_than_seconds": older_than_seconds, "batch_size": batch_size, "now": now},
        )
        return len(rows)
