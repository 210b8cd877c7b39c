"""jobs and queues tables, claim and reaper indexes, backoff and error-history functions

Revision ID: 0001
Revises:
Create Date: 2026-11-30
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "jobs",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=True), nullable=False),
        sa.Column("queue", sa.Text(), nullable=False),
        sa.Column("type", sa.Text(), nullable=False),
        sa.Column(
            "payload", postgresql.JSONB(), server_default=sa.text("'null'::jsonb"), nullable=False
        ),
        sa.Column("priority", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("status", sa.Text(), server_default=sa.text("'pending'"), nullable=False),
        sa.Column("attempts", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("max_attempts", sa.Integer(), nullable=False),
        sa.Column(
            "run_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False
        ),
        sa.Column("lease_id", postgresql.UUID(as_uuid=True), nullable=True),
        sa.Column("worker_id", sa.Text(), nullable=True),
        sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("lease_seconds", sa.Integer(), nullable=False),
        sa.Column("idempotency_key", sa.Text(), nullable=True),
        sa.Column("idempotency_hash", sa.Text(), nullable=True),
        sa.Column("result", postgresql.JSONB(), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column(
            "errors", postgresql.JSONB(), server_default=sa.text("'[]'::jsonb"), nullable=False
        ),
        sa.Column("checkpoint", postgresql.JSONB(), nullable=True),
        sa.Column("checkpoint_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("progress", postgresql.JSONB(), nullable=True),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column(
            "updated_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.CheckConstraint(
            "status IN ('pending', 'running', 'succeeded', 'dead', 'cancelled')",
            name=op.f("ck_jobs_status"),
        ),
        sa.CheckConstraint("attempts >= 0", name=op.f("ck_jobs_attempts")),
        sa.CheckConstraint("max_attempts >= 1", name=op.f("ck_jobs_max_attempts")),
        sa.CheckConstraint("lease_seconds BETWEEN 1 AND 43200", name=op.f("ck_jobs_lease_seconds")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_jobs")),
    )
    op.create_index(
        "ix_jobs_claimable",
        "jobs",
        ["queue", sa.text("priority DESC"), "run_at", "id"],
        postgresql_where=sa.text("status = 'pending'"),
    )
    op.create_index(
        "uq_jobs_queue_idempotency_key",
        "jobs",
        ["queue", "idempotency_key"],
        unique=True,
        postgresql_where=sa.text("idempotency_key IS NOT NULL"),
    )
    op.create_index(
        "ix_jobs_running_lease_expires_at",
        "jobs",
        ["lease_expires_at"],
        postgresql_where=sa.text("status = 'running'"),
    )
    op.create_index("ix_jobs_queue_status_id", "jobs", ["queue", "status", "id"])
    op.create_table(
        "queues",
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("paused", sa.Boolean(), server_default=sa.text("false"), nullable=False),
        sa.Column(
            "updated_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_queues")),
    )
    # Full-jitter backoff: a random delay in (0, min(cap, base * 2^(attempt-1))] seconds.
    op.execute(
        """
        CREATE FUNCTION jobq_backoff(attempt int, base float8, cap float8) RETURNS interval
        LANGUAGE sql VOLATILE PARALLEL SAFE AS $$
            SELECT make_interval(secs => LEAST(cap, base * power(2::float8, LEAST(GREATEST(attempt - 1, 0), 62)))
                                         * (1 - random()))
        $$
        """
    )
    # Appends an entry to a job's error history, keeping the newest `keep`.
    op.execute(
        """
        CREATE FUNCTION jobq_errors_append(history jsonb, entry jsonb, keep int) RETURNS jsonb
        LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
            SELECT COALESCE(jsonb_agg(e ORDER BY ord), '[]'::jsonb)
            FROM (
                SELECT e, ord
                FROM jsonb_array_elements(COALESCE(history, '[]'::jsonb) || jsonb_build_array(entry))
                     WITH ORDINALITY AS t(e, ord)
                ORDER BY ord DESC
                LIMIT keep
            ) newest
        $$
        """
    )


def downgrade() -> None:
    op.execute("DROP FUNCTION jobq_errors_append(jsonb, jsonb, int)")
    op.execute("DROP FUNCTION jobq_backoff(int, float8, float8)")
    op.drop_table("queues")
    op.drop_index("ix_jobs_queue_status_id", table_name="jobs")
    op.drop_index("ix_jobs_running_lease_expires_at", table_name="jobs")
    op.drop_index("uq_jobs_queue_idempotency_key", table_name="jobs")
    op.drop_index("ix_jobs_claimable", table_name="jobs")
    op.drop_table("jobs")
