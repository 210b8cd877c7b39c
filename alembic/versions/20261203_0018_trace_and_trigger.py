"""Trace context on jobs; schedules triggered by hand

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-03

- ``jobs.traceparent``: the W3C trace context an enqueue carried (its ``traceparent`` header, or
  the service's own enqueue span when tracing is on), handed to the worker with each claim so the
  handler's span joins the producer's trace. NULL for jobs enqueued without one; no index, since
  nothing looks jobs up by it.
- ``audit_log``: ``schedule.trigger`` (an admin ran a schedule once, now, outside its cron)
  joins the recorded actions.

Rolling deploys: instances still on 0017's code neither store nor hand out the trace context,
and their ``GET /v1/audit`` does not know ``schedule.trigger``.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# As app/models.py has them today; a migration keeps its own copy.
_ACTIONS_BEFORE = (
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
    "queue.create",
    "queue.delete",
    "job.run_now",
)
_ACTIONS_AFTER = (*_ACTIONS_BEFORE, "schedule.trigger")


def _actions_check(actions: Sequence[str]) -> None:
    op.drop_constraint(op.f("ck_audit_log_action"), "audit_log", type_="check")
    op.create_check_constraint(
        op.f("ck_audit_log_action"),
        "audit_log",
        "action IN (" + ", ".join(f"'{a}'" for a in actions) + ")",
    )


def upgrade() -> None:
    # A nullable column with no default: a catalog change, no table rewrite.
    op.add_column("jobs", sa.Column("traceparent", sa.Text(), nullable=True))
    _actions_check(_ACTIONS_AFTER)


def downgrade() -> None:
    op.execute("DELETE FROM audit_log WHERE action = 'schedule.trigger'")
    _actions_check(_ACTIONS_BEFORE)
    op.drop_column("jobs", "traceparent")
