"""Typed rows of composing work (migration 0021): a workflow, a step moved, a parent's outcome."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from app.domain.records import Record


@dataclass(slots=True)
class ParentOutcome(Record):
    """One parent of a claimed job: how it ended, and its result while the claim has room for it."""

    job_id: int  # the claimed job
    id: int  # the parent
    step: str | None  # None too when hidden
    status: str  # 'deleted' when the parent is gone
    hidden: bool  # its queue is outside the claiming key's scopes: neither step nor result
    has_result: bool
    size: int  # of its result as JSON text (0 without one)
    result: Any | None  # read when ``inline``
    inline: bool  # the statement read its result for the claim (the rest is decided after)


@dataclass(slots=True)
class Workflow(Record):
    """One row of ``workflows``."""

    id: int
    name: str
    steps: int
    created_by: str | None
    created_by_key_id: int | None
    created_at: datetime
    # Migration 0026: the create's idempotency key and its request's fingerprint.
    idempotency_key: str | None = None
    idempotency_hash: str | None = None


@dataclass(slots=True)
class StepMoved(Record):
    """A workflow step a cancel or retry moved: where it was, and where it went."""

    id: int
    queue: str
    status_before: str
    status: str = "cancelled"
