"""scheduled state, how each lease ended, run_at window, per-queue counters kept by triggers

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01

- ``scheduled`` becomes a stored state: jobs waiting for their ``run_at`` leave the claim index
  (``status = 'pending'``) until the promoter moves them, so tomorrow's jobs cost a claim nothing.
- ``lease_ended_by`` records which transition ended the current lease (complete, fail, release,
  cancel, expire, timeout), so a replay is honoured only as the same transition.
- ``run_at`` must lie in [1970-01-01, 9000-01-01) UTC, a window PostgreSQL and Python both hold.
  Rows stored before the check are clamped into it (their time had passed or is centuries away).
- ``queue_counts`` / ``queue_throughput``: per-queue counts per state and per-minute outcomes,
  kept exact by statement-level triggers with transition tables, so ``GET /v1/queues`` reads a
  few counter rows instead of counting the history. Each backend writes its own shard
  (``pg_backend_pid() % 16``), so concurrent statements do not queue on one counter row.
- Indexes for the listing filters, the promoter, the pruner's per-state cutoffs and the oldest
  pending job of a queue.

Rolling deploys: code of revision 0005 keeps working against this schema (it never writes
``scheduled``, and claims only ``pending`` rows). Two of its indexes are replaced:
``ix_jobs_pending_run_at`` (its promoter's) and ``ix_jobs_finished_at`` (its pruner's). Kept, the
first lures the planner into walking every pending row of every queue for one queue's oldest
job; both cost a write on every transition. While an older instance is the leader its promoter
and pruner scan more; nothing they decide changes.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

STATES = "'pending', 'scheduled', 'running', 'succeeded', 'dead', 'cancelled'"
FINISHED = "status IN ('succeeded', 'cancelled', 'dead')"
EARLIEST = "1970-01-01 00:00:00+00"
LATEST = "9000-01-01 00:00:00+00"
SHARDS = 16


def upgrade() -> None:
    op.drop_constraint(op.f("ck_jobs_status"), "jobs", type_="check")
    op.create_check_constraint(op.f("ck_jobs_status"), "jobs", f"status IN ({STATES})")

    op.add_column("jobs", sa.Column("lease_ended_by", sa.Text(), nullable=True))
    op.create_check_constraint(
        op.f("ck_jobs_lease_ended_by"),
        "jobs",
        "lease_ended_by IN ('complete', 'fail', 'release', 'cancel', 'expire', 'timeout')",
    )

    # Values outside the window cannot even be read back by the driver; move them to its edge.
    op.execute(
        f"UPDATE jobs SET run_at = GREATEST(LEAST(run_at, '{LATEST}'::timestamptz - interval '1 second'), "
        f"'{EARLIEST}'::timestamptz) "
        f"WHERE run_at < '{EARLIEST}' OR run_at >= '{LATEST}'"
    )
    op.execute(
        f"ALTER TABLE jobs ADD CONSTRAINT ck_jobs_run_at_window "
        f"CHECK (run_at >= '{EARLIEST}' AND run_at < '{LATEST}') NOT VALID"
    )
    op.execute("ALTER TABLE jobs VALIDATE CONSTRAINT ck_jobs_run_at_window")

    op.create_index(
        "ix_jobs_scheduled_run_at",
        "jobs",
        ["run_at"],
        postgresql_where=sa.text("status = 'scheduled'"),
    )
    op.create_index(
        "ix_jobs_pending_queue_run_at",
        "jobs",
        ["queue", "run_at"],
        postgresql_where=sa.text("status = 'pending'"),
    )
    op.create_index(
        "ix_jobs_finished_status_finished_at",
        "jobs",
        ["status", "finished_at"],
        postgresql_where=sa.text(FINISHED),
    )
    op.create_index("ix_jobs_queue_type_status_id", "jobs", ["queue", "type", "status", "id"])
    op.drop_index("ix_jobs_pending_run_at", table_name="jobs")
    op.drop_index("ix_jobs_finished_at", table_name="jobs")

    op.create_table(
        "queue_counts",
        sa.Column("queue", sa.Text(), nullable=False),
        sa.Column("status", sa.Text(), nullable=False),
        sa.Column("shard", sa.SmallInteger(), nullable=False),
        sa.Column("jobs", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("queue", "status", "shard", name="pk_queue_counts"),
    )
    op.create_table(
        "queue_throughput",
        sa.Column("queue", sa.Text(), nullable=False),
        sa.Column("minute", sa.DateTime(timezone=True), nullable=False),
        sa.Column("outcome", sa.Text(), nullable=False),
        sa.Column("shard", sa.SmallInteger(), nullable=False),
        sa.Column("jobs", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("queue", "minute", "outcome", "shard", name="pk_queue_throughput"),
    )
    op.create_index("ix_queue_throughput_minute", "queue_throughput", ["minute"])

    op.execute(
        f"""
        CREATE FUNCTION jobq_counter_shard() RETURNS smallint
        LANGUAGE sql STABLE PARALLEL SAFE AS $$ SELECT (pg_backend_pid() % {SHARDS})::smallint $$
        """
    )
    # Counter rows are written in (queue, status) order, so two statements never deadlock on them.
    op.execute(
        """
        CREATE FUNCTION jobq_counts_inserted() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            INSERT INTO queue_counts AS c (queue, status, shard, jobs)
            SELECT queue, status, jobq_counter_shard(), count(*)
            FROM jobq_new GROUP BY queue, status ORDER BY queue, status
            ON CONFLICT (queue, status, shard) DO UPDATE SET jobs = c.jobs + EXCLUDED.jobs;
            RETURN NULL;
        END $$
        """
    )
    op.execute(
        """
        CREATE FUNCTION jobq_counts_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            INSERT INTO queue_counts AS c (queue, status, shard, jobs)
            SELECT queue, status, jobq_counter_shard(), -count(*)
            FROM jobq_old GROUP BY queue, status ORDER BY queue, status
            ON CONFLICT (queue, status, shard) DO UPDATE SET jobs = c.jobs + EXCLUDED.jobs;
            RETURN NULL;
        END $$
        """
    )
    # An attempt that failed (fail, or a lease that expired or timed out) counts as 'failed' when
    # it is retried and as 'dead' when it was the last; entering succeeded / cancelled counts too.
    op.execute(
        """
        CREATE FUNCTION jobq_counts_updated() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            INSERT INTO queue_counts AS c (queue, status, shard, jobs)
            SELECT queue, status, jobq_counter_shard(), sum(delta)
            FROM (
                SELECT o.queue, o.status, -1 AS delta
                FROM jobq_old o JOIN jobq_new n ON n.id = o.id
                WHERE n.status <> o.status OR n.queue <> o.queue
                UNION ALL
                SELECT n.queue, n.status, 1
                FROM jobq_old o JOIN jobq_new n ON n.id = o.id
                WHERE n.status <> o.status OR n.queue <> o.queue
            ) moved
            GROUP BY queue, status
            HAVING sum(delta) <> 0
            ORDER BY queue, status
            ON CONFLICT (queue, status, shard) DO UPDATE SET jobs = c.jobs + EXCLUDED.jobs;

            INSERT INTO queue_throughput AS t (queue, minute, outcome, shard, jobs)
            SELECT n.queue, date_trunc('minute', now()),
                   CASE WHEN n.status IN ('succeeded', 'dead', 'cancelled') THEN n.status
                        ELSE 'failed' END,
                   jobq_counter_shard(), count(*)
            FROM jobq_old o JOIN jobq_new n ON n.id = o.id
            WHERE n.status <> o.status
              AND (n.status IN ('succeeded', 'dead', 'cancelled')
                   OR (o.status = 'running'
                       AND n.lease_ended_by IN ('fail', 'expire', 'timeout')))
            GROUP BY 1, 2, 3
            ORDER BY 1, 2, 3
            ON CONFLICT (queue, minute, outcome, shard) DO UPDATE SET jobs = t.jobs + EXCLUDED.jobs;
            RETURN NULL;
        END $$
        """
    )
    op.execute(
        """
        CREATE FUNCTION jobq_counts_truncated() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            DELETE FROM queue_counts;
            DELETE FROM queue_throughput;
            RETURN NULL;
        END $$
        """
    )
    # Jobs already waiting for their time move to the new state.
    op.execute("UPDATE jobs SET status = 'scheduled' WHERE status = 'pending' AND run_at > now()")
    # The first ALTER TABLE above locked out every writer until this transaction commits, so the
    # counts taken below and the deltas the triggers add from then on sum up exactly.
    op.execute(
        "CREATE TRIGGER jobs_counts_inserted AFTER INSERT ON jobs REFERENCING NEW TABLE AS jobq_new "
        "FOR EACH STATEMENT EXECUTE FUNCTION jobq_counts_inserted()"
    )
    op.execute(
        "CREATE TRIGGER jobs_counts_updated AFTER UPDATE ON jobs "
        "REFERENCING OLD TABLE AS jobq_old NEW TABLE AS jobq_new "
        "FOR EACH STATEMENT EXECUTE FUNCTION jobq_counts_updated()"
    )
    op.execute(
        "CREATE TRIGGER jobs_counts_deleted AFTER DELETE ON jobs REFERENCING OLD TABLE AS jobq_old "
        "FOR EACH STATEMENT EXECUTE FUNCTION jobq_counts_deleted()"
    )
    op.execute(
        "CREATE TRIGGER jobs_counts_truncated AFTER TRUNCATE ON jobs "
        "FOR EACH STATEMENT EXECUTE FUNCTION jobq_counts_truncated()"
    )
    op.execute(
        "INSERT INTO queue_counts (queue, status, shard, jobs) "
        "SELECT queue, status, 0, count(*) FROM jobs GROUP BY queue, status "
        "ON CONFLICT (queue, status, shard) DO UPDATE SET jobs = EXCLUDED.jobs"
    )


def downgrade() -> None:
    op.execute("DROP TRIGGER jobs_counts_truncated ON jobs")
    op.execute("DROP TRIGGER jobs_counts_deleted ON jobs")
    op.execute("DROP TRIGGER jobs_counts_updated ON jobs")
    op.execute("DROP TRIGGER jobs_counts_inserted ON jobs")
    op.execute("DROP FUNCTION jobq_counts_truncated()")
    op.execute("DROP FUNCTION jobq_counts_updated()")
    op.execute("DROP FUNCTION jobq_counts_deleted()")
    op.execute("DROP FUNCTION jobq_counts_inserted()")
    op.execute("DROP FUNCTION jobq_counter_shard()")
    op.drop_index("ix_queue_throughput_minute", table_name="queue_throughput")
    op.drop_table("queue_throughput")
    op.drop_table("queue_counts")
    op.create_index(
        "ix_jobs_finished_at", "jobs", ["finished_at"], postgresql_where=sa.text(FINISHED)
    )
    op.create_index(
        "ix_jobs_pending_run_at", "jobs", ["run_at"], postgresql_where=sa.text("status = 'pending'")
    )
    op.drop_index("ix_jobs_queue_type_status_id", table_name="jobs")
    op.drop_index("ix_jobs_finished_status_finished_at", table_name="jobs")
    op.drop_index("ix_jobs_pending_queue_run_at", table_name="jobs")
    op.drop_index("ix_jobs_scheduled_run_at", table_name="jobs")
    op.execute("ALTER TABLE jobs DROP CONSTRAINT ck_jobs_run_at_window")
    op.drop_constraint(op.f("ck_jobs_lease_ended_by"), "jobs", type_="check")
    op.drop_column("jobs", "lease_ended_by")
    # Scheduled jobs become what older code expects: pending with run_at ahead.
    op.execute("UPDATE jobs SET status = 'pending' WHERE status = 'scheduled'")
    op.drop_constraint(op.f("ck_jobs_status"), "jobs", type_="check")
    op.create_check_constraint(
        op.f("ck_jobs_status"),
        "jobs",
        "status IN ('pending', 'running', 'succeeded', 'dead', 'cancelled')",
    )
