"""A job's history: job_events

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-03

- ``job_events``: one row for each transition of a job that its row cannot tell afterwards,
  written by the transition's own statement: the claim of an attempt that did not complete,
  progress milestones, releases, failures (with the error's type, message and traceback), expired
  and timed-out leases, promotions, cancels, retries and runs-now with their actor. The happy
  path (enqueued, claimed, completed) writes nothing: ``GET /v1/jobs/{id}/events`` reads those
  three from the job's own columns, so enqueue, claim and complete cost what they cost before.
- Events live as long as their job: a statement trigger deletes a deleted job's events (pruner,
  bulk delete, queue delete), and truncating ``jobs`` truncates ``job_events``. No foreign key,
  so ``TRUNCATE jobs`` keeps working and no insert takes a lock on the job row it names.
- ``jobq_progress_decile(progress)``: 0 to 10 for a progress of the form
  ``{"done": n, "total": m}``, NULL otherwise; a heartbeat records a milestone when it rises.
- ``jobq_mask_message(message)``: a failure's message with quoted values, UUIDs, long hex
  strings and numbers masked, so ``GET /v1/failures`` groups ``order 17 not found`` with
  ``order 18 not found``.
- ``ix_jobs_retrying``: the scheduled jobs waiting out a retry's backoff (after a failure or an
  expired or timed-out lease), per queue: what ``GET /v1/queues`` counts as ``retrying`` and
  ``GET /v1/jobs?status=retrying`` lists, told apart from jobs scheduled for later. Only such
  rows are in it, so enqueue, claim and complete never touch it.
- ``workers``: the workers seen claiming, by (worker id, API key; 0 without one), with the
  queues they poll, the instance that saw them and when (first and last, the database's clock).
  Each instance keeps its sightings in memory and writes them every few seconds in one
  statement, so a claim costs no write; rows unseen for a day are deleted. What
  ``GET /v1/workers`` lists besides lease holders (idle, long-polling workers), and what tells a
  pending job that no live worker polls its queue.
- ``jobs.progress_at``: when a heartbeat last moved the job's progress or checkpoint, to flag a
  running job that heartbeats without moving as possibly stuck.
- ``audit_log``: ``job.run_now`` joins the recorded actions.

Rolling deploys: instances still on 0016's code write no events (their transitions show only as
the job's columns tell them) and their ``GET /v1/audit`` does not know ``job.run_now``.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# As app/models.py has them today; a migration keeps its own copy.
_KINDS = (
    "claimed",
    "progress",
    "released",
    "failed",
    "lease_expired",
    "timed_out",
    "completed",
    "promoted",
    "cancelled",
    "retried",
    "run_now",
)

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
)
_ACTIONS_AFTER = (*_ACTIONS_BEFORE, "job.run_now")

_RETRYING = "status = 'scheduled' AND lease_ended_by IN ('fail', 'expire', 'timeout')"

_PROGRESS_DECILE = """
CREATE FUNCTION jobq_progress_decile(progress jsonb) RETURNS int
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE
        WHEN jsonb_typeof(progress->'done') = 'number' AND jsonb_typeof(progress->'total') = 'number'
             AND (progress->>'total')::float8 > 0
        THEN LEAST(GREATEST(floor(10 * (progress->>'done')::float8
                                  / (progress->>'total')::float8), 0), 10)::int
    END
$$
"""

# Quoted values first (a quoted number is one value), then UUIDs and long hex strings (before
# their digits are taken for numbers), then numbers standing as words of their own.
_MASK_MESSAGE = r"""
CREATE FUNCTION jobq_mask_message(message text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT regexp_replace(regexp_replace(regexp_replace(regexp_replace(regexp_replace(
        left(message, 2000),
        '''[^'']*''', '''?''', 'g'),
        '"[^"]*"', '"?"', 'g'),
        '[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}', '<uuid>', 'gi'),
        '\m(0x[0-9a-f]+|(?=[a-f]*[0-9])[0-9a-f]{8,})\M', '<hex>', 'gi'),
        '\m[0-9]+(\.[0-9]+)?\M', '<n>', 'g')
$$
"""

_EVENTS_DELETED = """
CREATE FUNCTION jobq_events_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM job_events e USING jobq_old o WHERE e.job_id = o.id;
    RETURN NULL;
END $$
"""

_EVENTS_TRUNCATED = """
CREATE FUNCTION jobq_events_truncated() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    TRUNCATE job_events;
    RETURN NULL;
END $$
"""


def _actions_check(actions: Sequence[str]) -> None:
    op.drop_constraint(op.f("ck_audit_log_action"), "audit_log", type_="check")
    op.create_check_constraint(
        op.f("ck_audit_log_action"),
        "audit_log",
        "action IN (" + ", ".join(f"'{a}'" for a in actions) + ")",
    )


def upgrade() -> None:
    op.create_table(
        "job_events",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=True), nullable=False),
        sa.Column("job_id", sa.BigInteger(), nullable=False),
        sa.Column(
            "at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False
        ),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=True),
        sa.Column("actor", sa.Text(), nullable=True),
        sa.Column("actor_key_id", sa.BigInteger(), nullable=True),
        sa.Column("instance", sa.Text(), nullable=True),
        sa.Column("data", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.CheckConstraint(
            "kind IN (" + ", ".join(f"'{k}'" for k in _KINDS) + ")",
            name=op.f("ck_job_events_kind"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_job_events")),
    )
    op.create_index("ix_job_events_job_id_at", "job_events", ["job_id", "at", "id"])
    op.create_index(
        "ix_job_events_failures_at",
        "job_events",
        ["at"],
        postgresql_where=sa.text("kind IN ('failed', 'lease_expired', 'timed_out')"),
    )
    op.create_index(
        "ix_jobs_retrying",
        "jobs",
        ["queue", "id"],
        postgresql_where=sa.text(_RETRYING),
    )
    op.add_column("jobs", sa.Column("progress_at", sa.DateTime(timezone=True), nullable=True))
    op.create_table(
        "workers",
        sa.Column("worker_id", sa.Text(), nullable=False),
        sa.Column("key_id", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        sa.Column("queues", postgresql.ARRAY(sa.Text()), nullable=False),
        sa.Column("instance", sa.Text(), nullable=True),
        sa.Column(
            "first_seen_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column(
            "last_seen_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.PrimaryKeyConstraint("worker_id", "key_id", name=op.f("pk_workers")),
    )
    op.create_index("ix_workers_last_seen_at", "workers", ["last_seen_at"])
    op.execute(_PROGRESS_DECILE)
    op.execute(_MASK_MESSAGE)
    op.execute(_EVENTS_DELETED)
    op.execute(_EVENTS_TRUNCATED)
    op.execute(
        "CREATE TRIGGER jobs_events_deleted AFTER DELETE ON jobs "
        "REFERENCING OLD TABLE AS jobq_old "
        "FOR EACH STATEMENT EXECUTE FUNCTION jobq_events_deleted()"
    )
    op.execute(
        "CREATE TRIGGER jobs_events_truncated AFTER TRUNCATE ON jobs "
        "FOR EACH STATEMENT EXECUTE FUNCTION jobq_events_truncated()"
    )
    _actions_check(_ACTIONS_AFTER)


def downgrade() -> None:
    op.drop_index("ix_jobs_retrying", table_name="jobs")
    op.drop_table("workers")
    op.drop_column("jobs", "progress_at")
    op.execute("DELETE FROM audit_log WHERE action = 'job.run_now'")
    _actions_check(_ACTIONS_BEFORE)
    op.execute("DROP TRIGGER jobs_events_truncated ON jobs")
    op.execute("DROP TRIGGER jobs_events_deleted ON jobs")
    op.execute("DROP FUNCTION jobq_events_truncated()")
    op.execute("DROP FUNCTION jobq_events_deleted()")
    op.execute("DROP FUNCTION jobq_mask_message(text)")
    op.execute("DROP FUNCTION jobq_progress_decile(jsonb)")
    op.drop_table("job_events")
