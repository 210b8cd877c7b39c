"""A job's history, failures grouped by cause and a queue's recent figures, as operators read
them during an incident.

The history is written by the transitions themselves (``sql/jobs.sql``, in the transition's own
statement); this service reads it. Failures are grouped from the recorded failed, expired and
timed-out attempts of a recent window, by queue, job type, error type and cause: the fingerprint
of the traceback's frames the failure was recorded with (app/domain/fingerprints.py), else the
message with every token holding a digit or a quoted value masked (``jobq_failure_pattern``,
migration 0027). A queue's figures over a window (failure rates, wait and run percentiles) come
from its newest finished jobs' own columns (``queue_window_stats``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from app.domain.bounds import valid_id
from app.domain.failure_records import FailureGroup
from app.domain.records import JobHistoryEntry, QueueWindowStats
from app.errors import NotFound
from app.queue.cursors import decode_event_cursor, encode_event_cursor
from app.store import Stores
from app.store.unit import UnitOfWork

# How many of the newest failures of the window one grouping reads at most: bounded work
# whatever the failure rate; the answer says when the window held more.
FAILURES_SCANNED_MAX = 20_000
FAILURE_SAMPLES = 5
# How many of a queue's newest finished jobs of each state its window figures read at most:
# bounded work (a few thousand buffers) however long the history; the answer says when a
# window may hold more.
QUEUE_STATS_SCANNED_MAX = 2_000


@dataclass(frozen=True)
class FailureKey:
    """One failure group, as GET /v1/failures keys it."""

    queue: str
    type: str
    error_type: str
    fingerprint: str


@dataclass(frozen=True)
class Failures:
    """The groups of a window, and whether the window held more failures than were read."""

    since: datetime
    groups: list[FailureGroup]
    scanned: int
    truncated: bool


class HistoryService:
    """Reads jobs' histories, groups their failures and sums up a queue's recent jobs."""

    def __init__(self, *, unit: UnitOfWork, stores: Stores) -> None:
        self.unit = unit
        self.stores = stores

    async def events(
        self, job_id: int, *, after: str | None, limit: int
    ) -> tuple[list[JobHistoryEntry], str | None]:
        """A page of the job's history, oldest first, and the cursor of the next (``None``: the
        last page); ``NotFound`` for an unknown job."""
        position = decode_event_cursor(after) if after is not None else None
        if not valid_id(job_id):
            raise NotFound(f"job {job_id} not found")
        async for attempt in self.unit.ops():
            async with attempt as conn:
                job = await self.stores.jobs.job_get(conn, job_id=job_id)
                rows = await self.stores.job_events.job_event_list(
                    conn, job_id=job_id, after=position, limit=limit + 1
                )
        if job is None:
            raise NotFound(f"job {job_id} not found")
        if len(rows) <= limit:
            return rows, None
        rows = rows[:limit]
        return rows, encode_event_cursor(rows[-1].at, rows[-1].id)

    async def failures(
        self,
        *,
        window_seconds: float,
        queue: str | None = None,
        queue_patterns: Sequence[str] | None = None,
        limit: int = 50,
    ) -> Failures:
        """The failures of the last ``window_seconds``, grouped by cause, largest group first."""
        since = datetime.now(UTC) - timedelta(seconds=window_seconds)
        async for attempt in self.unit.ops():
            async with attempt as conn:
                groups = await self.stores.job_events.job_failure_groups(
                    conn,
                    since=since,
                    queue=queue,
                    queue_patterns=queue_patterns,
                    scan=FAILURES_SCANNED_MAX,
                    samples=FAILURE_SAMPLES,
                    limit=limit,
                )
        scanned = groups[0].scanned if groups else 0
        return Failures(
            since=since, groups=groups, scanned=scanned, truncated=scanned >= FAILURES_SCANNED_MAX
        )

    async def failure_group(
        self, key: FailureKey, *, window_seconds: float, limit: int = 200
    ) -> FailureGroup | None:
        """The group ``key`` names as the window's grouping shows it now, if it is among its
        queue's ``limit`` largest: what a confirmation shows of the group it acts on."""
        found = await self.failures(window_seconds=window_seconds, queue=key.queue, limit=limit)
        return next(
            (
                g
                for g in found.groups
                if (g.type, g.error_type, g.fingerprint)
                == (key.type, key.error_type, key.fingerprint)
            ),
            None,
        )

    async def failure_group_jobs(
        self,
        key: FailureKey,
        *,
        window_seconds: float,
        statuses: Sequence[str],
        queue_patterns: Sequence[str] | None = None,
        limit: int,
    ) -> list[int]:
        """The ids of one group's jobs now in ``statuses``, newest first (at most ``limit``)."""
        since = datetime.now(UTC) - timedelta(seconds=window_seconds)
        async for attempt in self.unit.ops():
            async with attempt as conn:
                ids = await self.stores.job_events.job_failure_group_ids(
                    conn,
                    since=since,
                    queue=key.queue,
                    type=key.type,
                    error_type=key.error_type,
                    fingerprint=key.fingerprint,
                    statuses=statuses,
                    queue_patterns=queue_patterns,
                    scan=FAILURES_SCANNED_MAX,
                    limit=limit,
                )
        return ids

    async def queue_window_stats(
        self, queue: str, *, windows: Sequence[float]
    ) -> list[QueueWindowStats]:
        """The queue's finished jobs over each window (seconds back from now), in order:
        outcomes, attempts, and wait and run percentiles; ``NotFound`` for an unknown queue."""
        if not windows:
            return []
        async for attempt in self.unit.ops():
            async with attempt as conn:
                rows = await self.stores.queues.queue_window_stats(
                    conn, queue=queue, windows=windows, scan=QUEUE_STATS_SCANNED_MAX
                )
        if not rows[0].known:
            raise NotFound(f"queue {queue} not found")
        return rows
