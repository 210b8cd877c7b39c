"""One typed async method per named statement; the only code that executes SQL against the queue."""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import RowMapping, Select, and_, func, select
from sqlalchemy.ext.asyncio import AsyncConnection

from app.models import jobs
from app.queue.queries import statement
from app.queue.states import VisibleStatus

JobRow = RowMapping

# Maintenance leader lock key: "jobq" in ASCII, so it is recognisable in pg_locks.
MAINTENANCE_LOCK_KEY = 0x6A6F6271


def _json_default(value: object) -> str:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, uuid.UUID):
        return str(value)
    raise TypeError(f"cannot encode {type(value).__name__} as JSON")


def to_json(value: object) -> str:
    """Encodes a value for a jsonb parameter; NaN and Infinity are refused, never stored."""
    return json.dumps(value, allow_nan=False, separators=(",", ":"), default=_json_default)


@dataclass(frozen=True)
class BackoffPolicy:
    """How long a failed or expired attempt waits before it may run again, and what history is kept."""

    base_seconds: float = 1.0
    cap_seconds: float = 3600.0
    errors_kept: int = 20
    error_max_chars: int = 4000


@dataclass(frozen=True)
class LeaseOutcome:
    """The verdict for one lease item of a heartbeat / complete / fail / release call."""

    job_id: int
    status: str | None
    cancelled: bool
    lease_expires_at: datetime | None = None
    run_at: datetime | None = None
    queue: str | None = None
    claimable_now: bool = False
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        """Whether the caller held the lease (or is repeating a call that already took effect)."""
        return self.status is not None


@dataclass(frozen=True)
class ListFilter:
    """Filters and keyset position of a job listing (newest first)."""

    queue: str | None = None
    status: VisibleStatus | None = None
    type: str | None = None
    before_id: int | None = None
    limit: int = 50


class Repository:
    """Runs the named statements of ``sql/*.sql``; callers own the transaction."""

    def __init__(self, *, backoff: BackoffPolicy) -> None:
        self.backoff = backoff

    async def job_enqueue(
        self, conn: AsyncConnection, *, items: Sequence[Mapping[str, Any]]
    ) -> list[JobRow | None]:
        """Inserts jobs in order; ``None`` where the item's idempotency key already exists."""
        result = await conn.execute(statement("job_enqueue").clause, {"items": to_json(items)})
        return [row if row["id"] is not None else None for row in result.mappings().all()]

    async def job_get_by_idempotency_keys(
        self, conn: AsyncConnection, *, keys: Sequence[tuple[str, str]]
    ) -> dict[tuple[str, str], JobRow]:
        """The jobs holding the given (queue, idempotency_key) pairs."""
        payload = [{"queue": q, "idempotency_key": k} for q, k in keys]
        result = await conn.execute(
            statement("job_get_by_idempotency_keys").clause, {"keys": to_json(payload)}
        )
        return {(row["queue"], row["idempotency_key"]): row for row in result.mappings().all()}

    async def job_get(self, conn: AsyncConnection, *, job_id: int) -> JobRow | None:
        """One job by id, or ``None``."""
        result = await conn.execute(statement("job_get").clause, {"id": job_id})
        return result.mappings().one_or_none()

    async def job_list(self, conn: AsyncConnection, *, where: ListFilter) -> list[JobRow]:
        """A page of jobs, newest first, after the keyset position ``before_id``."""
        query: Select[Any] = select(jobs, func.now().label("db_now"))
        if where.queue is not None:
            query = query.where(jobs.c.queue == where.queue)
        if where.type is not None:
            query = query.where(jobs.c.type == where.type)
        if where.status is VisibleStatus.SCHEDULED:
            query = query.where(and_(jobs.c.status == "pending", jobs.c.run_at > func.now()))
        elif where.status is VisibleStatus.PENDING:
            query = query.where(and_(jobs.c.status == "pending", jobs.c.run_at <= func.now()))
        elif where.status is not None:
            query = query.where(jobs.c.status == where.status.value)
        if where.before_id is not None:
            query = query.where(jobs.c.id < where.before_id)
        query = query.order_by(jobs.c.id.desc()).limit(where.limit)
        result = await conn.execute(query)
        return list(result.mappings().all())

    async def job_claim(
        self,
        conn: AsyncConnection,
        *,
        worker_id: str,
        queues: Sequence[str],
        max_jobs: int,
        lease_seconds: int | None,
    ) -> list[JobRow]:
        """Leases up to ``max_jobs`` due jobs of the given queues to ``worker_id``."""
        result = await conn.execute(
            statement("job_claim").clause,
            {
                "worker_id": worker_id,
                "queues": list(queues),
                "max_jobs": max_jobs,
                "lease_seconds": lease_seconds,
            },
        )
        rows = list(result.mappings().all())
        # The UPDATE returns rows in no particular order; hand them out in claim order.
        rows.sort(key=lambda r: (-r["priority"], r["run_at"], r["id"]))
        return rows

    async def _lease_call(
        self,
        conn: AsyncConnection,
        name: str,
        *,
        worker_id: str,
        items: Sequence[Mapping[str, Any]],
        extra: Mapping[str, Any] | None = None,
    ) -> list[LeaseOutcome]:
        params: dict[str, Any] = {"worker_id": worker_id, "items": to_json(items)}
        params.update(extra or {})
        result = await conn.execute(statement(name).clause, params)
        return [
            LeaseOutcome(
                job_id=row["job_id"],
                status=row["status"],
                cancelled=bool(row["cancelled"]),
                lease_expires_at=row.get("lease_expires_at"),
                run_at=row.get("run_at"),
                queue=row.get("queue"),
                claimable_now=bool(row.get("claimable_now")),
                timed_out=bool(row.get("timed_out")),
            )
            for row in result.mappings().all()
        ]

    async def job_heartbeat(
        self, conn: AsyncConnection, *, worker_id: str, items: Sequence[Mapping[str, Any]]
    ) -> list[LeaseOutcome]:
        """Extends held leases, saving checkpoint and progress under the same ownership check."""
        return await self._lease_call(conn, "job_heartbeat", worker_id=worker_id, items=items)

    async def job_complete(
        self, conn: AsyncConnection, *, worker_id: str, items: Sequence[Mapping[str, Any]]
    ) -> list[LeaseOutcome]:
        """Marks held jobs succeeded."""
        return await self._lease_call(conn, "job_complete", worker_id=worker_id, items=items)

    async def job_fail(
        self, conn: AsyncConnection, *, worker_id: str, items: Sequence[Mapping[str, Any]]
    ) -> list[LeaseOutcome]:
        """Records failed attempts: retried after a backoff, or dead."""
        return await self._lease_call(
            conn, "job_fail", worker_id=worker_id, items=items, extra=self._backoff_params()
        )

    async def job_release(
        self, conn: AsyncConnection, *, worker_id: str, items: Sequence[Mapping[str, Any]]
    ) -> list[LeaseOutcome]:
        """Returns held jobs to pending without charging the attempt."""
        return await self._lease_call(conn, "job_release", worker_id=worker_id, items=items)

    async def job_cancel(self, conn: AsyncConnection, *, job_id: int) -> JobRow | None:
        """Cancels a pending or running job; ``None`` when its state does not allow it."""
        result = await conn.execute(statement("job_cancel").clause, {"id": job_id})
        return result.mappings().one_or_none()

    async def job_retry(self, conn: AsyncConnection, *, job_id: int) -> JobRow | None:
        """Moves a finished job back to pending; ``None`` when its state does not allow it."""
        result = await conn.execute(statement("job_retry").clause, {"id": job_id})
        return result.mappings().one_or_none()

    async def job_reap(self, conn: AsyncConnection, *, batch_size: int) -> list[JobRow]:
        """Returns at most ``batch_size`` expired leases to pending (or dead); answers the rows moved."""
        params = {"batch_size": batch_size, **self._backoff_params()}
        params.pop("error_max_chars")
        result = await conn.execute(statement("job_reap").clause, params)
        return list(result.mappings().all())

    async def job_prune(
        self,
        conn: AsyncConnection,
        *,
        batch_size: int,
        succeeded_seconds: float,
        cancelled_seconds: float,
        dead_seconds: float,
    ) -> int:
        """Deletes at most ``batch_size`` finished jobs past retention; answers how many."""
        result = await conn.execute(
            statement("job_prune").clause,
            {
                "batch_size": batch_size,
                "succeeded_seconds": succeeded_seconds,
                "cancelled_seconds": cancelled_seconds,
                "dead_seconds": dead_seconds,
            },
        )
        return len(result.all())

    async def queue_set_paused(self, conn: AsyncConnection, *, name: str, paused: bool) -> JobRow:
        """Pauses or resumes a queue."""
        result = await conn.execute(
            statement("queue_set_paused").clause, {"name": name, "paused": paused}
        )
        return result.mappings().one()

    async def queue_stats(self, conn: AsyncConnection) -> list[JobRow]:
        """Counts per queue and state."""
        result = await conn.execute(statement("queue_stats").clause)
        return list(result.mappings().all())

    async def worker_list(self, conn: AsyncConnection) -> list[JobRow]:
        """Workers holding leases now."""
        result = await conn.execute(statement("worker_list").clause)
        return list(result.mappings().all())

    async def wakeup_notify(
        self, conn: AsyncConnection, *, channel: str, payloads: Sequence[str]
    ) -> None:
        """Sends the wake-up notifications (one per payload)."""
        if payloads:
            await conn.execute(
                statement("wakeup_notify").clause, {"channel": channel, "payloads": list(payloads)}
            )

    async def job_due_since(
        self, conn: AsyncConnection, *, since: datetime | None
    ) -> tuple[dict[str, int], datetime]:
        """Per queue, how many pending jobs came due after ``since``; and the database's now()."""
        rows = (await conn.execute(statement("job_due_since").clause, {"since": since})).all()
        checked_at: datetime = rows[-1].checked_at
        return {r.queue: int(r.due) for r in rows if r.queue is not None}, checked_at

    async def job_due_in_queues(
        self, conn: AsyncConnection, *, queues: Sequence[str], cap: int
    ) -> dict[str, int]:
        """Per unpaused queue, how many jobs are due now (counted up to ``cap``)."""
        result = await conn.execute(
            statement("job_due_in_queues").clause, {"queues": list(queues), "cap": cap}
        )
        return {row.queue: int(row.due) for row in result}

    async def maintenance_try_lead(self, conn: AsyncConnection) -> bool:
        """Takes the maintenance leader lock on this connection's session, if free."""
        result = await conn.execute(
            statement("maintenance_try_lead").clause, {"lock_key": MAINTENANCE_LOCK_KEY}
        )
        return bool(result.scalar_one())

    async def maintenance_ping(self, conn: AsyncConnection) -> None:
        """Fails if the leader's lock connection is gone."""
        await conn.execute(statement("maintenance_ping").clause)

    async def health_ping(self, conn: AsyncConnection) -> None:
        """Fails if the database does not answer."""
        await conn.execute(statement("health_ping").clause)

    def _backoff_params(self) -> dict[str, Any]:
        return {
            "backoff_base": self.backoff.base_seconds,
            "backoff_cap": self.backoff.cap_seconds,
            "errors_kept": self.backoff.errors_kept,
            "error_max_chars": self.backoff.error_max_chars,
        }
