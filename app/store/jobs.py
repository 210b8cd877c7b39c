"""JobStore: the statements of ``sql/jobs.sql`` and the job builders, one method each.

The hot statements (enqueue, claim, the lease calls and their verdicts, reading one job) run on
a driver connection in the service's unit of work; the others on a SQLAlchemy one. Callers own
the transaction.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from app.domain.records import (
    BulkCandidate,
    Job,
    JobBlockers,
    WorkerLeases,
)
from app.domain.states import BulkAction, JobStatus
from app.domain.types import (
    NOT_GIVEN,
    BackoffPolicy,
    ClaimOutcome,
    ClaimSlot,
    JobSearch,
    LeaseOutcome,
    LeaseTransition,
    LeaseUpdate,
    ListFilter,
    OpsOutcome,
)
from app.store.conn import Conn, Row, to_json
from app.store.listing import (
    job_bulk_batch_query,
    job_count_query,
    job_id_ceiling_query,
    job_list_query,
)


def _ops_outcome(rows: Sequence[Row]) -> OpsOutcome | None:
    if not rows:
        return None
    row = rows[0]
    return OpsOutcome(
        job=Job.from_row(row), changed=bool(row["changed"]), status_before=row.get("status_before")
    )


# A settle-and-claim statement's arguments and answer: the lease items, the claim's slots; the
# items the transition took (by position) and what the claim took.
Leases = Sequence[LeaseUpdate]
Slots = Sequence[ClaimSlot]
SettledClaim = tuple[dict[int, LeaseOutcome], ClaimOutcome]


def _taken_by_position(rows: Sequence[Mapping[str, Any]]) -> dict[int, LeaseOutcome]:
    """The rows a lease transition returned (``ord``: the item's 1-based position), as outcomes
    by position. Rows read from JSON (job_complete_claim's ``settled``) carry run_at as text."""
    taken = {}
    for row in rows:
        run_at = row.get("run_at")
        taken[int(row["ord"]) - 1] = LeaseOutcome(
            job_id=row["job_id"],
            status=row["status"],
            lease_expires_at=row.get("lease_expires_at"),
            run_at=datetime.fromisoformat(run_at) if isinstance(run_at, str) else run_at,
            queue=row.get("queue"),
            type=row.get("type"),
            ran_seconds=row.get("ran_seconds"),
            freed_flow=bool(row.get("freed_flow")),
        )
    return taken


def _lease_params(item: LeaseUpdate) -> dict[str, Any]:
    """A lease update as the lease statements read it: a field not given is left out (the
    statement keeps the stored value), a ``None`` is sent as JSON null (it clears it)."""
    params: dict[str, Any] = {
        "job_id": item.job_id,
        "lease_id": item.lease_id,
        "worker_id": item.worker_id,
        "key_id": item.key_id,
        "lease_seconds": item.lease_seconds,
        "result": item.result,
        "error": item.error,
        "error_type": item.error_type,
        "traceback": item.traceback,
        "fingerprint": item.fingerprint,
        "retryable": item.retryable,
        "retry_after_seconds": item.retry_after_seconds,
        "delay_seconds": item.delay_seconds,
    }
    if item.checkpoint is not NOT_GIVEN:
        params["checkpoint"] = item.checkpoint
    if item.progress is not NOT_GIVEN:
        params["progress"] = item.progress
    return params


class JobStore:
    """Runs the jobs table's statements; callers own the transaction."""

    def __init__(self, *, backoff: BackoffPolicy, instance: str | None = None) -> None:
        self.backoff = backoff
        # This jobq instance's name, written on the leases it grants (GET /v1/workers shows it).
        self.instance = instance

    # -- reads -----------------------------------------------------------------------------

    async def job_get(self, conn: Conn, *, job_id: int) -> Job | None:
        """One job by id, or ``None``."""
        rows = await conn.fetch("job_get", {"id": job_id})
        return Job.from_row(rows[0]) if rows else None

    async def job_list(self, conn: Conn, *, where: ListFilter) -> list[Job]:
        """A page of jobs, newest first, after the keyset position ``before_id`` (a builder)."""
        return [Job.from_row(row) for row in await conn.fetch_query(job_list_query(where))]

    # -- workers -----------------------------------------------------------------------------

    async def job_claim(
        self, conn: Conn, *, queues: Sequence[str], slots: Sequence[ClaimSlot]
    ) -> ClaimOutcome:
        """Leases up to one due job per slot (its worker, key and lease length), best job to slot 1,
        while no limit exists; with limits it takes nothing and says so (``flow_active``).

        Answers one entry per slot, in order: the row leased in it, or ``None`` when fewer jobs
        were due than slots asked.
        """
        return await self._claim(conn, "job_claim", queues=queues, slots=slots, window=1)

    async def job_claim_limited(
        self,
        conn: Conn,
        *,
        queues: Sequence[str],
        slots: Sequence[ClaimSlot],
        window: int,
    ) -> ClaimOutcome:
        """As :meth:`job_claim`, within the concurrency and rate limits, reading ``window``
        candidates per slot; also reports the limited rows it found missing or held by others
        and when an empty bucket refills."""
        return await self._claim(
            conn, "job_claim_limited", queues=queues, slots=slots, window=window
        )

    async def job_complete_claim(
        self, conn: Conn, *, items: Leases, queues: Sequence[str], slots: Slots
    ) -> SettledClaim:
        """:meth:`job_complete`, then :meth:`job_claim`, in one statement: the items taken (by
        position) and what the claim took."""
        return await self._settle_claim(conn, "job_complete_claim", items, queues, slots)

    async def job_complete_claim_limited(
        self, conn: Conn, *, items: Leases, queues: Sequence[str], slots: Slots, window: int
    ) -> SettledClaim:
        """:meth:`job_complete`, then :meth:`job_claim_limited`, in one statement: the items
        taken (by position) and what the claim took, with its report of the limits."""
        name = "job_complete_claim_limited"
        return await self._settle_claim(conn, name, items, queues, slots, window)

    async def job_fail_claim(
        self, conn: Conn, *, items: Leases, queues: Sequence[str], slots: Slots
    ) -> SettledClaim:
        """:meth:`job_fail`, then :meth:`job_claim`, in one statement."""
        backoff = self._backoff_params()
        return await self._settle_claim(conn, "job_fail_claim", items, queues, slots, 1, backoff)

    async def job_fail_claim_limited(
        self, conn: Conn, *, items: Leases, queues: Sequence[str], slots: Slots, window: int
    ) -> SettledClaim:
        """:meth:`job_fail`, then :meth:`job_claim_limited`, in one statement."""
        backoff = self._backoff_params()
        name = "job_fail_claim_limited"
        return await self._settle_claim(conn, name, items, queues, slots, window, backoff)

    async def job_release_claim(
        self, conn: Conn, *, items: Leases, queues: Sequence[str], slots: Slots
    ) -> SettledClaim:
        """:meth:`job_release`, then :meth:`job_claim`, in one statement."""
        return await self._settle_claim(conn, "job_release_claim", items, queues, slots)

    async def job_release_claim_limited(
        self, conn: Conn, *, items: Leases, queues: Sequence[str], slots: Slots, window: int
    ) -> SettledClaim:
        """:meth:`job_release`, then :meth:`job_claim_limited`, in one statement."""
        name = "job_release_claim_limited"
        return await self._settle_claim(conn, name, items, queues, slots, window)

    async def _settle_claim(
        self,
        conn: Conn,
        name: str,
        items: Leases,
        queues: Sequence[str],
        slots: Slots,
        window: int = 1,
        extra: Mapping[str, Any] | None = None,
    ) -> SettledClaim:
        params = self._claim_params(queues, slots, window=window)
        params["items"] = to_json([_lease_params(item) for item in items])
        params.update(extra or {})
        rows = await conn.fetch(name, params)
        settled = next((r["settled"] for r in rows if r["settled"] is not None), ())
        return _taken_by_position(settled), self._claimed(rows, slots)

    def _claim_params(
        self, queues: Sequence[str], slots: Sequence[ClaimSlot], *, window: int
    ) -> dict[str, Any]:
        return {
            "queues": list(queues),
            "max_jobs": len(slots),
            "window": window,
            "worker_ids": [slot.worker_id for slot in slots],
            "key_ids": [slot.key_id for slot in slots],
            "lease_seconds": [slot.lease_seconds for slot in slots],
            "instance": self.instance,
        }

    async def _claim(
        self,
        conn: Conn,
        name: str,
        *,
        queues: Sequence[str],
        slots: Sequence[ClaimSlot],
        window: int,
    ) -> ClaimOutcome:
        rows = await conn.fetch(name, self._claim_params(queues, slots, window=window))
        return self._claimed(rows, slots)

    @staticmethod
    def _claimed(rows: Sequence[Row], slots: Sequence[ClaimSlot]) -> ClaimOutcome:
        by_slot: list[Job | None] = [None] * len(slots)
        for row in rows:
            if row["slot"] is not None:
                by_slot[row["slot"] - 1] = Job.from_row(row)
        if not rows:  # the statement of a release before limits reports nothing
            return ClaimOutcome(by_slot=by_slot)
        report = rows[0]
        return ClaimOutcome(
            by_slot=by_slot,
            flow_missing=tuple(report.get("flow_missing") or ()),
            flow_skipped=tuple(report.get("flow_skipped") or ()),
            flow_refused=int(report.get("flow_refused") or 0),
            flow_refill_seconds=report.get("flow_refill_seconds"),
            flow_active=bool(report.get("flow_active")),
        )

    async def _taken(
        self,
        conn: Conn,
        name: str,
        *,
        items: Sequence[LeaseUpdate],
        extra: Mapping[str, Any] | None = None,
    ) -> dict[int, LeaseOutcome]:
        params: dict[str, Any] = {"items": to_json([_lease_params(item) for item in items])}
        params.update(extra or {})
        return _taken_by_position(await conn.fetch(name, params))

    async def job_heartbeat(
        self, conn: Conn, *, items: Sequence[LeaseUpdate]
    ) -> dict[int, LeaseOutcome]:
        """Extends held leases with checkpoint and progress; answers the items taken, by position."""
        return await self._taken(conn, "job_heartbeat", items=items)

    async def job_complete(
        self, conn: Conn, *, items: Sequence[LeaseUpdate]
    ) -> dict[int, LeaseOutcome]:
        """Marks held jobs succeeded; answers the items taken, by position."""
        return await self._taken(conn, "job_complete", items=items)

    async def job_fail(
        self, conn: Conn, *, items: Sequence[LeaseUpdate]
    ) -> dict[int, LeaseOutcome]:
        """Records failed attempts (retried after a backoff, or dead); answers the items taken."""
        return await self._taken(conn, "job_fail", items=items, extra=self._backoff_params())

    async def job_release(
        self, conn: Conn, *, items: Sequence[LeaseUpdate]
    ) -> dict[int, LeaseOutcome]:
        """Returns held jobs to pending without charging the attempt; answers the items taken."""
        return await self._taken(conn, "job_release", items=items)

    async def job_lease_verdict(
        self,
        conn: Conn,
        *,
        transition: LeaseTransition,
        items: Sequence[LeaseUpdate],
    ) -> list[LeaseOutcome]:
        """For items a transition did not take: replay of the same transition, or lost (in order)."""
        keys = [
            {
                "job_id": i.job_id,
                "lease_id": i.lease_id,
                "worker_id": i.worker_id,
                "key_id": i.key_id,
            }
            for i in items
        ]
        rows = await conn.fetch(
            "job_lease_verdict",
            {
                "items": to_json(keys),
                # A heartbeat ends nothing, so it has nothing to replay.
                "transition": None if transition is LeaseTransition.HEARTBEAT else transition.value,
            },
        )
        return [
            LeaseOutcome(
                job_id=row["job_id"],
                status=row["status"],
                cancelled=bool(row["cancelled"]),
                timed_out=bool(row["timed_out"]),
                lease_expires_at=row["lease_expires_at"] if row["status"] else None,
                run_at=row["run_at"] if row["status"] else None,
            )
            for row in rows
        ]

    async def job_blockers(
        self, conn: Conn, *, job_id: int, live_seconds: float
    ) -> JobBlockers | None:
        """What may hold the job back now; ``None`` for an unknown job."""
        rows = await conn.fetch("job_blockers", {"id": job_id, "live_seconds": live_seconds})
        return JobBlockers.from_row(rows[0]) if rows else None

    async def worker_list(
        self, conn: Conn, *, queue_patterns: Sequence[str] | None = None
    ) -> list[WorkerLeases]:
        """Workers holding leases now; with ``queue_patterns`` (LIKE), only in matching queues."""
        patterns = list(queue_patterns) if queue_patterns is not None else None
        rows = await conn.fetch("worker_list", {"queue_patterns": patterns})
        return [WorkerLeases.from_row(row) for row in rows]

    # -- ops ---------------------------------------------------------------------------------

    # Retry records itself in audit_log in its own statement, naming ``actor`` (and its API
    # key's id, ``None`` without one); cancel's caller adds audit_insert.

    async def job_cancel(
        self, conn: Conn, *, job_id: int, actor: str, actor_key_id: int | None
    ) -> OpsOutcome | None:
        """Cancels a pending, scheduled or running job; the job as it is now, ``None`` if unknown.

        The row also carries ``status_before``, the state the decision saw.
        """
        rows = await conn.fetch(
            "job_cancel", {"id": job_id, "actor": actor, "actor_key_id": actor_key_id}
        )
        return _ops_outcome(rows)

    async def job_run_now(
        self, conn: Conn, *, job_id: int, actor: str, actor_key_id: int | None
    ) -> OpsOutcome | None:
        """Makes a scheduled (or retrying) job due now; the job as it is now, ``None`` if unknown."""
        rows = await conn.fetch(
            "job_run_now", {"id": job_id, "actor": actor, "actor_key_id": actor_key_id}
        )
        return _ops_outcome(rows)

    async def job_retry(
        self, conn: Conn, *, job_id: int, actor: str, actor_key_id: int | None
    ) -> OpsOutcome | None:
        """Moves a finished job back to pending; the job as it is now, ``None`` if unknown."""
        rows = await conn.fetch(
            "job_retry", {"id": job_id, "actor": actor, "actor_key_id": actor_key_id}
        )
        return _ops_outcome(rows)

    async def job_count(
        self, conn: Conn, *, search: JobSearch, statuses: Sequence[JobStatus]
    ) -> int:
        """How many jobs in ``statuses`` the search covers now (a builder)."""
        [row] = await conn.fetch_query(job_count_query(search, statuses))
        return int(next(iter(row.values())))

    async def job_bulk_batch(
        self,
        conn: Conn,
        *,
        action: BulkAction,
        search: JobSearch,
        statuses: Sequence[JobStatus],
        below_id: int | None,
        batch_size: int,
        actor: str,
        actor_key_id: int | None,
    ) -> list[BulkCandidate]:
        """One batch of a bulk action: its candidates (id, queue) and whether each was changed."""
        query = job_bulk_batch_query(
            action,
            search,
            statuses,
            below_id=below_id,
            batch_size=batch_size,
            actor=actor,
            actor_key_id=actor_key_id,
        )
        return [BulkCandidate.from_row(row) for row in await conn.fetch_query(query)]

    async def job_id_ceiling(self, conn: Conn) -> int | None:
        """One past the highest job id now (the primary key's last entry), ``None`` when empty."""
        [row] = await conn.fetch_query(job_id_ceiling_query())
        value = next(iter(row.values()))
        return int(value) if value is not None else None

    # -- maintenance -------------------------------------------------------------------------

    async def job_due_in_queues(
        self, conn: Conn, *, queues: Sequence[str], cap: int
    ) -> dict[str, int]:
        """Per unpaused queue, how many jobs are due now (counted up to ``cap``)."""
        rows = await conn.fetch("job_due_in_queues", {"queues": list(queues), "cap": cap})
        return {row["queue"]: int(row["due"]) for row in rows}

    # -- awaiting results ----------------------------------------------------------------------

    async def job_await_mark(self, conn: Conn, *, job_id: int) -> Job | None:
        """Marks an unfinished job as awaited and answers it; ``None``: finished, awaited already, or unknown."""
        rows = await conn.fetch("job_await_mark", {"id": job_id})
        return Job.from_row(rows[0]) if rows else None

    async def job_await_settled(self, conn: Conn, *, job_ids: Sequence[int]) -> list[int]:
        """Which of these jobs are finished or gone."""
        rows = await conn.fetch("job_await_settled", {"ids": list(job_ids)})
        return [int(row["id"]) for row in rows]

    def _backoff_params(self) -> dict[str, Any]:
        return {
            "backoff_base": self.backoff.base_seconds,
            "backoff_cap": self.backoff.cap_seconds,
            "errors_kept": self.backoff.errors_kept,
            "error_max_chars": self.backoff.error_max_chars,
            "traceback_max_chars": self.backoff.traceback_max_chars,
        }
