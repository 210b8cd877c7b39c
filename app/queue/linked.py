"""Jobs linked to others (depends_on, ordering_key): helpers of the hot path.

What a claimed job that waited for others learns of them (ParentReader: JobService holds one
and calls it after a claim took such jobs, so jobs without parents never pay for it), and which
enqueues take locks (``linked``) and in what order (``ordering_keys_of``). Not a service.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from app.domain.records import Job
from app.domain.types import NewJob
from app.domain.workflow_records import ParentOutcome
from app.store import Stores
from app.store.unit import UnitOfWork


@dataclass(frozen=True)
class ParentResultBounds:
    """How much of its parents' results a claimed job carries inline (the rest by reference)."""

    inline_bytes: int = 64 * 1024
    total_bytes: int = 1024 * 1024


def parents_summary(outcomes: Sequence[ParentOutcome]) -> dict[str, Any]:
    """What a claim hands a job about its parents: counts per end, the failed ones, each one."""
    counts = {"succeeded": 0, "dead": 0, "cancelled": 0}
    for o in outcomes:
        if o.status in counts:
            counts[o.status] += 1
    return {
        "total": len(outcomes),
        **counts,
        # A parent gone (pruned after it ended, or deleted) is told as "deleted": not a failure.
        "failed_ids": [o.id for o in outcomes if o.status in ("dead", "cancelled")],
        "jobs": [
            {
                "id": o.id,
                "step": o.step,
                "status": o.status,
                "result": o.result,
                "result_by_reference": o.by_reference,
            }
            for o in outcomes
        ],
    }


class ParentReader:
    """Reads the parents of claimed jobs in one statement and hands each job its summary."""

    def __init__(self, *, unit: UnitOfWork, stores: Stores, bounds: ParentResultBounds) -> None:
        self.unit = unit
        self.stores = stores
        self.bounds = bounds

    async def hand(self, claimed: Sequence[Job]) -> None:
        """Fills in ``parents`` of the claimed jobs that waited for others."""
        ids = [row.id for row in claimed if row.depends_on]
        async for attempt in self.unit.hot(idempotent=True):
            async with attempt as conn:
                outcomes = await self.stores.workflows.job_parent_outcomes(
                    conn,
                    ids=ids,
                    inline_bytes=self.bounds.inline_bytes,
                    total_bytes=self.bounds.total_bytes,
                )
        by_job: dict[int, list[ParentOutcome]] = {}
        for outcome in outcomes:
            by_job.setdefault(outcome.job_id, []).append(outcome)
        for row in claimed:
            if row.depends_on:
                row.parents = parents_summary(by_job.get(row.id, []))


def linked(job: NewJob) -> bool:
    """Whether the job names parents or an ordering key: its enqueue takes locks, so it runs in a
    transaction of its own call, never in a statement shared with other requests."""
    return job.depends_on is not None or job.ordering_key is not None


def ordering_keys_of(jobs: Sequence[NewJob]) -> list[tuple[str, str]]:
    """The (queue, ordering key) pairs of the jobs, sorted: the order their locks are taken in."""
    return sorted({(j.queue, j.ordering_key) for j in jobs if j.ordering_key is not None})
