"""JobEventStore: the statements of ``sql/job_events.sql``, reading a job's history and failures.

The history is written by the transitions themselves (``sql/jobs.sql``), in their own statement.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from app.domain.failure_records import FailureGroup
from app.domain.records import JobHistoryEntry
from app.store.conn import Conn


class JobEventStore:
    """Reads ``job_events`` merged with what the jobs' own columns tell."""

    async def job_event_list(
        self,
        conn: Conn,
        *,
        job_id: int,
        after: tuple[datetime, int] | None,
        limit: int,
    ) -> list[JobHistoryEntry]:
        """A page of the job's history, oldest first, after the keyset position ``after``."""
        rows = await conn.fetch(
            "job_event_list",
            {
                "job_id": job_id,
                "after_at": after[0] if after else None,
                "after_id": after[1] if after else None,
                "limit": limit,
            },
        )
        return [JobHistoryEntry.from_row(row) for row in rows]

    async def job_failure_groups(
        self,
        conn: Conn,
        *,
        since: datetime,
        queue: str | None,
        queue_patterns: Sequence[str] | None,
        scan: int,
        samples: int,
        limit: int,
    ) -> list[FailureGroup]:
        """The newest ``scan`` failures since ``since``, grouped by cause (the traceback's
        fingerprint, else the masked message), largest group first."""
        rows = await conn.fetch(
            "job_failure_groups",
            {
                "since": since,
                "queue": queue,
                "queue_patterns": list(queue_patterns) if queue_patterns is not None else None,
                "scan": scan,
                "samples": samples,
                "limit": limit,
            },
        )
        return [FailureGroup.from_row(row) for row in rows]

    async def job_failure_group_ids(
        self,
        conn: Conn,
        *,
        since: datetime,
        queue: str,
        type: str,
        error_type: str,
        fingerprint: str,
        statuses: Sequence[str],
        queue_patterns: Sequence[str] | None,
        scan: int,
        limit: int,
    ) -> list[int]:
        """The ids of one group's jobs now in ``statuses``, newest first."""
        rows = await conn.fetch(
            "job_failure_group_ids",
            {
                "since": since,
                "queue": queue,
                "type": type,
                "error_type": error_type,
                "fingerprint": fingerprint,
                "statuses": list(statuses),
                "queue_patterns": list(queue_patterns) if queue_patterns is not None else None,
                "scan": scan,
                "limit": limit,
            },
        )
        return [int(row["id"]) for row in rows]
