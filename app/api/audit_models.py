"""Bodies of the audit trail (``GET /v1/audit``): the actions it records and its entries."""

from __future__ import annotations

import enum
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field, JsonValue


class AuditAction(enum.StrEnum):
    """An admin action the audit trail records."""

    JOB_CANCEL = "job.cancel"
    JOB_RETRY = "job.retry"
    JOB_RUN_NOW = "job.run_now"
    QUEUE_PAUSE = "queue.pause"
    QUEUE_RESUME = "queue.resume"
    QUEUE_CREATE = "queue.create"
    QUEUE_DELETE = "queue.delete"
    KEY_CREATE = "key.create"
    KEY_REVOKE = "key.revoke"
    KEY_ROTATE_WEBHOOK_SECRET = "key.rotate_webhook_secret"
    BULK_RETRY = "bulk.retry"
    BULK_CANCEL = "bulk.cancel"
    BULK_DELETE = "bulk.delete"
    LIMIT_SET = "limit.set"
    LIMIT_DELETE = "limit.delete"
    SCHEDULE_CREATE = "schedule.create"
    SCHEDULE_UPDATE = "schedule.update"
    SCHEDULE_DELETE = "schedule.delete"
    SCHEDULE_PAUSE = "schedule.pause"
    SCHEDULE_RESUME = "schedule.resume"
    SCHEDULE_TRIGGER = "schedule.trigger"
    WORKFLOW_CANCEL = "workflow.cancel"
    WORKFLOW_RETRY = "workflow.retry"
    MAINTENANCE_PUT_BACK = "maintenance.put_back"


class AuditEntry(BaseModel):
    """One recorded admin action: who, when (the database's clock), what it touched, the outcome."""

    id: int
    at: datetime
    actor: str = Field(
        description='The acting key\'s name, "anonymous" (authentication off) or "cli:<user>".'
    )
    action: AuditAction
    outcome: Literal["changed", "unchanged", "refused"] = Field(
        description="refused only for key operations (a taken name, no live key of that name)."
    )
    queue: str | None = Field(
        description="The job's queue, or the queue created, deleted, paused or resumed."
    )
    job_id: int | None
    key_name: str | None = Field(description="The key created or revoked.")
    state_before: str | None = Field(
        description='The job\'s status, "paused" / "active", or "live" / "revoked" before.'
    )
    state_after: str | None
    detail: JsonValue = Field(
        description="For a key created: its role and queue scopes. For a bulk action: its "
        "search, the jobs it changed and its batches. For a schedule triggered: the schedule "
        "and the job enqueued."
    )


class AuditPage(BaseModel):
    """One page of the audit trail, newest first; pass ``next_cursor`` as ``after`` for the next."""

    entries: list[AuditEntry]
    next_cursor: str | None
