"""Periodic jobs (schedules)

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-01

- ``schedules``: one row per periodic job: a cron expression or an interval in seconds
  (exactly one, checked), an IANA time zone, the job template each run enqueues (queue, type,
  payload, priority, max_attempts, lease_seconds, timeout_seconds, concurrency_key, as columns so
  they are checked like the jobs' own and a scoped key's listing filters by queue), how many
  missed runs to catch up (0..1000), paused, who wrote it (``api`` or the ``file`` named by
  JOBQ_SCHEDULES) and ``next_run_at``, the next due run as an instant. The leader's scheduler
  walks ``ix_schedules_due`` (active schedules by due time) with ``FOR UPDATE SKIP LOCKED``,
  enqueues each due run as a job whose idempotency key names the schedule and the run's instant,
  and advances ``next_run_at`` with a conditional UPDATE in the same transaction: the unique
  (queue, idempotency_key) index of jobs is what makes a run enqueue once even when two
  instances run the scheduler. ``last_run_at`` / ``last_job_id`` say what the latest pass
  enqueued (no foreign key: the pruner deletes finished jobs).
- ``audit_log``: the schedule actions (create, update, delete, pause, resume) join the
  recorded actions; the list is 0012's (0010's and the limit actions of 0011) plus these.

Rolling deploys: the table is new, and code of revision 0012 never reads it, so old instances
run no scheduler. While an old instance holds the maintenance lock, due runs wait; the first new
leader enqueues them, within each schedule's catch_up. An old instance's ``GET /v1/audit`` does
not know the schedule actions: a page holding one fails there until that instance is replaced.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0013"
down_revision: str | None = "0012"
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
)
_AFTER = (
    *_BEFORE,
    "schedule.create",
    "schedule.update",
    "schedule.delete",
    "schedule.pause",
    "schedule.resume",
)


def _actions_check(actions: Sequence[str]) -> None:
    op.drop_constraint(op.f("ck_audit_log_action"), "audit_log", type_="check")
    op.create_check_constraint(
        op.f("ck_audit_log_action"),
        "audit_log",
        "action IN (" + ", ".join(f"'{a}'" for a in actions) + ")",
    )


def upgrade() -> None:
    op.create_table(
        "schedules",
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("cron", sa.Text(), nullable=True),
        sa.Column("interval_seconds", sa.Integer(), nullable=True),
        sa.Column("timezone", sa.Text(), server_default=sa.text("'UTC'"), nullable=False),
        sa.Column("queue", sa.Text(), nullable=False),
        sa.Column("type", sa.Text(), nullable=False),
        sa.Column(
            "payload",
            postgresql.JSONB(astext_type=sa.Text()),
            server_default=sa.text("'null'::jsonb"),
            nullable=False,
        ),
        sa.Column("priority", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("max_attempts", sa.Integer(), nullable=True),
        sa.Column("lease_seconds", sa.Integer(), nullable=True),
        sa.Column("timeout_seconds", sa.Integer(), nullable=True),
        sa.Column("concurrency_key", sa.Text(), nullable=True),
        sa.Column("catch_up", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("paused", sa.Boolean(), server_default=sa.text("false"), nullable=False),
        sa.Column("next_run_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_run_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_job_id", sa.BigInteger(), nullable=True),
        sa.Column("source", sa.Text(), server_default=sa.text("'api'"), nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column(
            "updated_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.CheckConstraint(
            "(cron IS NULL) <> (interval_seconds IS NULL)", name=op.f("ck_schedules_one_timing")
        ),
        sa.CheckConstraint(
            "name ~ '^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$'", name=op.f("ck_schedules_name")
        ),
        sa.CheckConstraint("char_length(cron) BETWEEN 1 AND 200", name=op.f("ck_schedules_cron")),
        sa.CheckConstraint(
            "interval_seconds BETWEEN 1 AND 31622400", name=op.f("ck_schedules_interval_seconds")
        ),
        sa.CheckConstraint(
            "char_length(timezone) BETWEEN 1 AND 64", name=op.f("ck_schedules_timezone")
        ),
        sa.CheckConstraint("catch_up BETWEEN 0 AND 1000", name=op.f("ck_schedules_catch_up")),
        sa.CheckConstraint(
            "max_attempts BETWEEN 1 AND 1000", name=op.f("ck_schedules_max_attempts")
        ),
        sa.CheckConstraint(
            "lease_seconds BETWEEN 1 AND 43200", name=op.f("ck_schedules_lease_seconds")
        ),
        sa.CheckConstraint(
            "timeout_seconds BETWEEN 1 AND 604800", name=op.f("ck_schedules_timeout_seconds")
        ),
        sa.CheckConstraint("source IN ('api', 'file')", name=op.f("ck_schedules_source")),
        sa.CheckConstraint(
            "next_run_at >= '1970-01-01 00:00:00+00' AND next_run_at < '9000-01-01 00:00:00+00'",
            name=op.f("ck_schedules_next_run_at_window"),
        ),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_schedules")),
    )
    op.create_index(
        "ix_schedules_due",
        "schedules",
        ["next_run_at"],
        postgresql_where=sa.text("NOT paused"),
    )
    op.create_index("ix_schedules_queue_name", "schedules", ["queue", "name"])
    _actions_check(_AFTER)


def downgrade() -> None:
    op.execute("DELETE FROM audit_log WHERE action LIKE 'schedule.%'")
    _actions_check(_BEFORE)
    op.drop_index("ix_schedules_queue_name", table_name="schedules")
    op.drop_index("ix_schedules_due", table_name="schedules")
    op.drop_table("schedules")
