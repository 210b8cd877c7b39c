"""What an enqueue answers per job once its insert ran: a helper of the hot path, not a service.

The insert skips a job whose (queue, idempotency_key) exists. Such a job is answered by the job
that holds the key when its request was the same (a replay), by ``IdempotencyKeyReused`` when
it was not, and by ``Retry`` when that job was deleted between the insert and the read.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from app.domain.records import Job, JobHead
from app.domain.types import NewJob
from app.errors import IdempotencyKeyReused


class Retry(Exception):
    """Internal: the unit of work must run again."""


def answer_enqueue(
    jobs: Sequence[NewJob],
    rows: Sequence[Job | JobHead | None],
    existing: Mapping[tuple[str, str], Job],
    *,
    singles: bool,
) -> list[tuple[Job | JobHead, bool] | Exception]:
    """Per job: its created row (``True``), the replayed job (``False``), or its error.

    ``existing``: the jobs holding the keys of the skipped ones. ``singles``: each job is a
    call of its own, so a reused key names position 0; otherwise its position in the call.
    """
    answered: list[tuple[Job | JobHead, bool] | Exception] = []
    for i, row in enumerate(rows):
        if row is not None:
            answered.append((row, True))
            continue
        key = (jobs[i].queue, jobs[i].idempotency_key or "")
        found = existing.get(key)
        if found is None:
            answered.append(Retry())
        elif found.idempotency_hash != jobs[i].fingerprint:
            answered.append(
                IdempotencyKeyReused(
                    f"idempotency key {key[1]!r} of queue {key[0]!r} was used for a "
                    "different request",
                    item=0 if singles else i,
                )
            )
        else:
            answered.append((found, False))
    return answered
