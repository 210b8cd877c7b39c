"""ScheduleStore: the statements of ``sql/schedules.sql`` (periodic jobs), one method each.

The scheduler's pass runs on a driver connection, in the transaction of the insert that enqueues
its runs; the definitions' reads and changes run on a SQLAlchemy connection.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from app.domain.records import Job, Schedule, ScheduleAt, ScheduleTriggered, ScheduleWritten
from app.domain.types import JobDefaults, ScheduleRun
from app.store.conn import Conn, to_json
from app.store.producers import enqueue_params


class ScheduleStore:
    """Runs the schedules table's statements; callers own the transaction."""

    async def schedule_due(
        self, conn: Conn, *, batch_size: int, now: datetime | None = None
    ) -> list[ScheduleAt]:
        """Locks at most ``batch_size`` due active schedules (SKIP LOCKED), with the clock (db_now)."""
        rows = await conn.fetch("schedule_due", {"batch_size": batch_size, "now": now})
        return [ScheduleAt.from_row(row) for row in rows]

    async def schedule_run_enqueue(
        self, conn: Conn, *, runs: Sequence[ScheduleRun]
    ) -> list[Job | None]:
        """Inserts the jobs of schedule runs in order; ``None`` where the run has its job already."""
        items = [
            {
                **enqueue_params(run.job),
                "schedule_name": run.schedule_name,
                "scheduled_for": run.scheduled_for,
            }
            for run in runs
        ]
        rows = await conn.fetch("schedule_run_enqueue", {"items": to_json(items)})
        return [Job.from_row(row) if row["id"] is not None else None for row in rows]

    async def schedule_run_jobs(
        self, conn: Conn, *, runs: Sequence[tuple[str, datetime]]
    ) -> dict[tuple[str, datetime], Job]:
        """The jobs the scheduler enqueued for the given (schedule name, run instant) pairs."""
        keys = [{"schedule_name": n, "scheduled_for": at} for n, at in runs]
        rows = await conn.fetch("schedule_run_jobs", {"keys": to_json(keys)})
        return {(row["schedule_name"], row["scheduled_for"]): Job.from_row(row) for row in rows}

    async def schedule_trigger(
        self,
        conn: Conn,
        *,
        name: str,
        defaults: JobDefaults,
        actor: str,
        actor_key_id: int | None,
        queue_patterns: Sequence[str] | None = None,
    ) -> ScheduleTriggered | None:
        """Enqueues one job from a schedule's template now and audits it, if its queue matches
        ``queue_patterns`` (LIKE); ``None`` when there is no such schedule."""
        rows = await conn.fetch(
            "schedule_trigger",
            {
                "name": name,
                "max_attempts": defaults.max_attempts,
                "lease_seconds": defaults.lease_seconds,
                "actor": actor,
                "actor_key_id": actor_key_id,
                "queue_patterns": list(queue_patterns) if queue_patterns is not None else None,
            },
        )
        if not rows:
            return None
        [row] = rows
        job = Job.from_row(row) if row["id"] is not None else None
        return ScheduleTriggered(queue=row["schedule_queue"], job=job)

    async def schedule_park(self, conn: Conn, *, items: Sequence[Mapping[str, Any]]) -> set[str]:
        """Records the error of schedules that could not be planned and parks them, where
        next_run_at is still ``expected``; the names parked."""
        rows = await conn.fetch("schedule_park", {"items": to_json(items)})
        return {row["name"] for row in rows}

    async def schedule_errored_counts(self, conn: Conn) -> dict[str, int]:
        """Schedules in error per queue."""
        rows = await conn.fetch("schedule_errored_counts")
        return {row["queue"]: int(row["errored"]) for row in rows}

    async def schedule_advance(self, conn: Conn, *, items: Sequence[Mapping[str, Any]]) -> set[str]:
        """Moves schedules to their next run where next_run_at is still ``expected``; the names moved."""
        rows = await conn.fetch("schedule_advance", {"items": to_json(items)})
        return {row["name"] for row in rows}

    async def schedule_lock(self, conn: Conn, *, name: str) -> ScheduleAt:
        """Locks one schedule for a change; the row (``name`` None if there is none) with db_now."""
        [row] = await conn.fetch("schedule_lock", {"name": name})
        return ScheduleAt.from_row(row)

    async def schedule_upsert(
        self, conn: Conn, *, values: Mapping[str, Any]
    ) -> ScheduleWritten | None:
        """Creates or replaces a schedule; the row written (with ``created``), ``None`` if unchanged."""
        params = {**values, "payload": to_json(values["payload"])}
        rows = await conn.fetch("schedule_upsert", params)
        return ScheduleWritten.from_row(rows[0]) if rows else None

    async def schedule_set_paused(
        self,
        conn: Conn,
        *,
        name: str,
        paused: bool,
        next_run_at: datetime | None = None,
    ) -> Schedule | None:
        """Pauses or resumes a schedule (a resume moves it to ``next_run_at``); ``None`` if it was so."""
        rows = await conn.fetch(
            "schedule_set_paused",
            {"name": name, "paused": paused, "next_run_at": next_run_at},
        )
        return Schedule.from_row(rows[0]) if rows else None

    async def schedule_delete(self, conn: Conn, *, name: str) -> Schedule | None:
        """Deletes one schedule; the row deleted, or ``None``."""
        rows = await conn.fetch("schedule_delete", {"name": name})
        return Schedule.from_row(rows[0]) if rows else None

    async def schedule_delete_stale_file(
        self, conn: Conn, *, names: Sequence[str]
    ) -> list[Schedule]:
        """Deletes the file's schedules that are not in ``names``; the rows deleted."""
        rows = await conn.fetch("schedule_delete_stale_file", {"names": list(names)})
        return [Schedule.from_row(row) for row in rows]

    async def schedule_get(self, conn: Conn, *, name: str) -> Schedule | None:
        """One schedule by name, or ``None``."""
        rows = await conn.fetch("schedule_get", {"name": name})
        return Schedule.from_row(rows[0]) if rows else None

    async def schedule_list(
        self,
        conn: Conn,
        *,
        after: str | None,
        limit: int,
        queue_patterns: Sequence[str] | None = None,
    ) -> list[Schedule]:
        """A page of schedules in name order after ``after``; with ``queue_patterns``, matching only."""
        rows = await conn.fetch(
            "schedule_list",
            {
                "after": after,
                "limit": limit,
                "queue_patterns": list(queue_patterns) if queue_patterns is not None else None,
            },
        )
        return [Schedule.from_row(row) for row in rows]
