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

# A key's queue scopes as SQL LIKE patterns (Principal.like_patterns); None: every queue.
Scopes = Sequence[str] | None


@dataclass(frozen=True)
class ParentResultBounds:
    """How much of its parents' results a claimed job carries inline (the rest by reference)."""

    inline_bytes: int = 64 * 1024
    total_bytes: int = 1024 * 1024


@dataclass(frozen=True)
class HandedParent:
    """One parent as a claim hands it on: its outcome, and its result when it comes inline."""

    outcome: ParentOutcome
    result: Any = None
    inline: bool = False

    @property
    def by_reference(self) -> bool:
        """The result exists, may be read, and is left to ``GET /v1/jobs/{id}``."""
        o = self.outcome
        return o.has_result and not o.hidden and not self.inline


def inline_choice(outcomes: Sequence[ParentOutcome], bounds: ParentResultBounds) -> list[bool]:
    """Which of one job's parents (in depends_on order) carry their results inline: each that
    may be read, fits ``inline_bytes``, and fits what the results inline before it left of
    ``total_bytes``; a result that does not come counts for nothing."""
    left = bounds.total_bytes
    chosen = []
    for o in outcomes:
        fits = o.has_result and not o.hidden and o.size <= bounds.inline_bytes and o.size <= left
        if fits:
            left -= o.size
        chosen.append(fits)
    return chosen


def parents_summary(parents: Sequence[HandedParent]) -> dict[str, Any]:
    """What a claim hands a job about its parents: counts per end, the failed ones, each one."""
    counts = {"succeeded": 0, "dead": 0, "cancelled": 0}
    for p in parents:
        if p.outcome.status in counts:
            counts[p.outcome.status] += 1
    return {
        "total": len(parents),
        **counts,
        # A parent gone (pruned after it ended, or deleted) is told as "deleted": not a failure.
        "failed_ids": [p.outcome.id for p in parents if p.outcome.status in ("dead", "cancelled")],
        "jobs": [
            {
                "id": p.outcome.id,
                "step": p.outcome.step,
                "status": p.outcome.status,
                "result": p.result if p.inline else None,
                "result_by_reference": p.by_reference,
                # Its queue is outside the claiming key's scopes: only its id and state are told.
                "result_hidden": p.outcome.hidden,
            }
            for p in parents
        ],
    }


class ParentReader:
    """Reads the parents of claimed jobs in one statement and hands each job its summary."""

    def __init__(self, *, unit: UnitOfWork, stores: Stores, bounds: ParentResultBounds) -> None:
        self.unit = unit
        self.stores = stores
        self.bounds = bounds

    async def hand(self, claimed: Sequence[Job], *, queue_patterns: Scopes = None) -> None:
        """Fills in ``parents`` of the claimed jobs that waited for others, telling the results
        only of parents in queues ``queue_patterns`` (SQL LIKE: the claiming key's scopes;
        ``None``: every queue) covers.

        One statement reads the parents, and the results inline up to the first that does not
        fit; results after it that fit what is left (a rare case: the budget ran out) are read
        by a second one.
        """
        ids = [row.id for row in claimed if row.depends_on]
        bounds = self.bounds
        async for attempt in self.unit.hot(idempotent=True):
            async with attempt as conn:
                outcomes = await self.stores.workflows.job_parent_outcomes(
                    conn,
                    ids=ids,
                    inline_bytes=bounds.inline_bytes,
                    total_bytes=bounds.total_bytes,
                    queue_patterns=queue_patterns,
                )
        by_job: dict[int, list[ParentOutcome]] = {}
        for outcome in outcomes:
            by_job.setdefault(outcome.job_id, []).append(outcome)
        chosen = {job_id: inline_choice(found, bounds) for job_id, found in by_job.items()}
        unread = sorted(
            {
                o.id
                for job_id, found in by_job.items()
                for o, inline in zip(found, chosen[job_id], strict=True)
                if inline and not o.inline
            }
        )
        results: dict[int, Any] = {}
        if unread:
            async for attempt in self.unit.hot(idempotent=True):
                async with attempt as conn:
                    results = await self.stores.workflows.job_parent_results(conn, ids=unread)
        for row in claimed:
            if not row.depends_on:
                continue
            found = by_job.get(row.id, [])
            handed = []
            for o, inline in zip(found, chosen.get(row.id, []), strict=True):
                if inline and not o.inline and o.id not in results:
                    inline = False  # deleted since: left to GET /v1/jobs/{id}, which says so
                result = (o.result if o.inline else results.get(o.id)) if inline else None
                handed.append(HandedParent(o, result, inline))
            row.parents = parents_summary(handed)


def linked(job: NewJob) -> bool:
    """Whether the job names parents or an ordering key: its enqueue takes locks, so it runs in a
    transaction of its own call, never in a statement shared with other requests."""
    return job.depends_on is not None or job.ordering_key is not None


def ordering_keys_of(jobs: Sequence[NewJob]) -> list[tuple[str, str]]:
    """The (queue, ordering key) pairs of the jobs, sorted: the order their locks are taken in."""
    return sorted({(j.queue, j.ordering_key) for j in jobs if j.ordering_key is not None})
