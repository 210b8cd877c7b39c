"""Queues are created and deleted explicitly

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-02

- ``audit_log``: ``queue.create`` (``PUT /v1/queues/{name}``) and ``queue.delete``
  (``DELETE /v1/queues/{name}``) join the recorded actions; the list is 0013's plus these.

No table changes: a queue is still a ``queues`` row (its switches) or the jobs that name it.
Rolling deploys: old instances neither create nor delete queues, and still pause a queue never
seen; their ``GET /v1/audit`` does not know the new actions, so a page holding one fails there
until that instance is replaced.
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# As app/models.py has them today; a migration keeps its own copy.
_BEFORE = (
    "job.cancel",
    "job.retry",
    "queue.pause",
    "queue.resume",
    "key.create",
    "key.revoke",
    "bulk.retry",
    "bulk.cancel",
    "bulk.delete",
    "limit.set",
    "limit.delete",
    "schedule.create",
    "schedule.update",
    "schedule.delete",
    "schedule.pause",
    "schedule.resume",
)
_AFTER = (*_BEFORE, "queue.create", "queue.delete")


def _actions_check(actions: Sequence[str]) -> None:
    op.drop_constraint(op.f("ck_audit_log_action"), "audit_log", type_="check")
    op.create_check_constraint(
        op.f("ck_audit_log_action"),
        "audit_log",
        "action IN (" + ", ".join(f"'{a}'" for a in actions) + ")",
    )


def upgrade() -> None:
    _actions_check(_AFTER)


def downgrade() -> None:
    op.execute("DELETE FROM audit_log WHERE action IN ('queue.create', 'queue.delete')")
    _actions_check(_BEFORE)
