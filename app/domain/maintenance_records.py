"""The records of the maintenance loops' own table (migration 0025)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from app.domain.records import Record


@dataclass(slots=True)
class SetAside(Record):
    """A job a maintenance loop could not move even alone (``maintenance_set_aside``)."""

    loop: str
    job_id: int
    queue: str | None
    error: str
    sqlstate: str | None
    failures: int
    first_failed_at: datetime
    last_failed_at: datetime
    status: str | None  # the job's state now (None: deleted, or not read)
