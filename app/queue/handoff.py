"""What a claim must not hand a worker: a job whose stored JSON no reader can take.

Such a value reached the table past the API's checks (an older version, a manual insert; see
app/stored_json.py). Handing it out would fail the worker's whole answer and bring the job back
after every lease, so the claim fails it at once, not retryable, naming the field and why; the
other jobs of the claim go out as usual.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from app.domain.records import Job
from app.domain.types import LeaseUpdate
from app.stored_json import claim_json_errors

logger = logging.getLogger("jobq.claims")


def split_unreadable(claimed: list[Job]) -> tuple[list[Job], list[Job]]:
    """The claimed jobs a worker can read, and those it cannot (mostly none)."""
    unreadable = [row for row in claimed if claim_json_errors(row) is not None]
    if not unreadable:
        return claimed, []
    return [row for row in claimed if claim_json_errors(row) is None], unreadable


def unreadable_failures(jobs: Sequence[Job]) -> list[LeaseUpdate]:
    """A fail, not retryable, for each job no worker can read, its error naming what and why."""
    items = []
    for row in jobs:
        reasons = claim_json_errors(row) or {}
        error = "stored JSON no reader can take: " + "; ".join(
            f"{field}: {why}" for field, why in sorted(reasons.items())
        )
        logger.error("job %d failed at its claim: %s", row.id, error)
        items.append(
            LeaseUpdate(
                job_id=row.id,
                lease_id=str(row.lease_id),
                error=error,
                error_type="UnreadableJson",
                retryable=False,
            )
        )
    return items
