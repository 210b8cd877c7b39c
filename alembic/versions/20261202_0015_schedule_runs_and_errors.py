"""Schedule runs are marked by the scheduler, not by idempotency keys; schedules record errors

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-02

- ``jobs.schedule_name`` / ``jobs.scheduled_for``: the schedule and run instant of a job the
  scheduler enqueued, NULL for every other job. Only the scheduler's insert writes them; no API
  field reaches them. ``uq_jobs_schedule_run`` (unique, partial) makes each run one job. Until
  now a run was the job with the idempotency key ``schedule:<name>:<instant>``, a key any
  producer of the queue could take first, so that the scheduler adopted the producer's job as
  the run. Jobs enqueued before this revision keep their keys and are not marked (which of them
  a producer made cannot be told): a run is enqueued once by the pass's own transaction, the
  marks are the second line of defence.
- ``schedules.last_error`` / ``schedules.errored_at``: why and since when a schedule could not
  be planned (say its zone is unknown to the instance that ran the pass). An errored schedule
  is parked: ``ix_schedules_due`` leaves it out, so no pass locks it again until a change
  (PUT, or a resume) clears the error.

Rolling deploys: instances of 0014 still serving enqueue runs with the old idempotency keys and
no marks, and do not skip errored schedules (they fail on them as before, without recording
anything). The new columns are nullable and the old statements never write them.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("jobs", sa.Column("schedule_name", sa.Text(), nullable=True))
    op.add_column("jobs", sa.Column("scheduled_for", sa.DateTime(timezone=True), nullable=True))
    op.create_index(
        "uq_jobs_schedule_run",
        "jobs",
        ["schedule_name", "scheduled_for"],
        unique=True,
        postgresql_where=sa.text("schedule_name IS NOT NULL"),
    )
    op.add_column("schedules", sa.Column("last_error", sa.Text(), nullable=True))
    op.add_column("schedules", sa.Column("errored_at", sa.DateTime(timezone=True), nullable=True))
    op.drop_index("ix_schedules_due", table_name="schedules")
    op.create_index(
        "ix_schedules_due",
        "schedules",
        ["next_run_at"],
        postgresql_where=sa.text("NOT paused AND errored_at IS NULL"),
    )


def downgrade() -> None:
    op.drop_index("ix_schedules_due", table_name="schedules")
    op.create_index(
        "ix_schedules_due",
        "schedules",
        ["next_run_at"],
        postgresql_where=sa.text("NOT paused"),
    )
    op.drop_column("schedules", "errored_at")
    op.drop_column("schedules", "last_error")
    op.drop_index("uq_jobs_schedule_run", table_name="jobs")
    op.drop_column("jobs", "scheduled_for")
    op.drop_column("jobs", "schedule_name")
