"""Why a job is not running (pure): what ``GET /v1/jobs/{id}/blockers`` and the job page say.

Read from one row of ``job_blockers`` (sql/jobs.sql): a pending job's blockers as the claim would
meet them, and what a waiting job waits for.
"""

from __future__ import annotations

from app.domain.records import JobBlockers
from app.domain.states import JobStatus
from app.domain.types import WORKER_LIVE_SECONDS, Blocker

# Parents named in a blocker's message at most; the rest are counted.
PARENTS_NAMED_MAX = 10


def blockers_of(row: JobBlockers) -> list[Blocker]:
    """What holds the job back now: for a pending job its queue's switch, limits and workers;
    for a waiting one its unfinished parents or the earlier job of its ordering key."""
    if row.status == JobStatus.PENDING:
        return _pending_blockers(row)
    if row.status == JobStatus.WAITING:
        return _waiting_blockers(row)
    return []


def _waiting_blockers(row: JobBlockers) -> list[Blocker]:
    found: list[Blocker] = []
    if row.parents_open:
        named = ", ".join(str(i) for i in row.parents_open[:PARENTS_NAMED_MAX])
        more = len(row.parents_open) - PARENTS_NAMED_MAX
        rest = f" and {more} more" if more > 0 else ""
        found.append(
            Blocker(
                "parents", f"waits for {len(row.parents_open)} unfinished job(s): {named}{rest}"
            )
        )
    if row.ordering_ahead is not None:
        found.append(
            Blocker(
                "ordering_key",
                f"job {row.ordering_ahead} of ordering key {row.ordering_key} runs first",
            )
        )
    return found


def _pending_blockers(row: JobBlockers) -> list[Blocker]:
    """A pending job's blockers, as the claim would meet them: the queue's switch, the key's and
    the queue's limits, then whether any live worker asks for the queue at all."""
    found: list[Blocker] = []
    if row.queue_paused:
        found.append(Blocker("queue_paused", f"queue {row.queue} is paused"))
    if row.concurrency_key is not None:
        key = row.concurrency_key
        if row.key_max_running is not None and (row.key_running or 0) >= row.key_max_running:
            found.append(
                Blocker("key_limit", f"key {key} at {row.key_running}/{row.key_max_running}")
            )
        if row.key_blocked_until is not None:
            found.append(
                Blocker(
                    "key_rate",
                    f"key {key} has no rate budget until {row.key_blocked_until.isoformat()}",
                    row.key_blocked_until,
                )
            )
    if row.queue_max_running is not None and (row.queue_running or 0) >= row.queue_max_running:
        found.append(
            Blocker(
                "queue_limit",
                f"queue {row.queue} at {row.queue_running}/{row.queue_max_running}",
            )
        )
    if row.queue_blocked_until is not None:
        found.append(
            Blocker(
                "queue_rate",
                f"queue {row.queue} has no rate budget until {row.queue_blocked_until.isoformat()}",
                row.queue_blocked_until,
            )
        )
    if row.live_workers == 0:
        found.append(
            Blocker(
                "no_worker",
                f"no live worker polls queue {row.queue} (none seen claiming in the last "
                f"{WORKER_LIVE_SECONDS:.0f} s)",
            )
        )
    return found
