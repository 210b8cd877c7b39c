"""Typed rows of failures grouped by cause (``job_failure_groups``)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from app.domain.fingerprints import culprit
from app.domain.records import Record


@dataclass(slots=True)
class FailureGroup(Record):
    """Recent failures of one cause: queue, job type, error type and ``fingerprint``, the
    fingerprint of the traceback's frames (``t:…``, app/domain/fingerprints.py), or for failures
    without one ``m:`` and the md5 of the message with every token holding a digit or a quoted
    value masked (``pattern``, by ``jobq_failure_pattern``)."""

    queue: str
    type: str
    error_type: str
    fingerprint: str
    pattern: str  # a traceback group's: its newest failure's message, masked
    failures: int
    failures_last_hour: int
    jobs: int
    dead_jobs: int
    first_seen_at: datetime
    last_seen_at: datetime
    last_message: str
    sample_job_ids: list[int]
    scanned: int
    by_traceback: bool
    last_traceback: str | None  # the newest failure's, when it came with one

    @property
    def culprit(self) -> str | None:
        """Where the newest failure was raised (``file in function``), read from its traceback."""
        return culprit(self.last_traceback)
