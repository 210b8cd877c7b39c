"""Counters as an append-only journal, folded in the background

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-03

Until now the counter triggers on ``jobs`` (migrations 0006 and 0010) upserted their rows of
``queue_counts`` and ``queue_throughput`` (``INSERT ... ON CONFLICT DO UPDATE`` on one of 16
shards per queue and state). Measured on the raw-SQL bench statements (issue 22): that upsert
was the largest single part of a one-job claim or complete on jobq's schema, and every
statement took a row lock on its shard until its commit, so concurrent statements of the same
queue waited on each other's commit (the 16-client rows suffered most), and each statement left
a dead version of the counter row behind.

Now the triggers only append: one row per (queue, state) a statement moved, with the signed
number of jobs, and one per (queue, minute, outcome). No conflict check, no row lock, no unique
index to maintain. Readers already summed the shards (``sum(jobs) ... GROUP BY``), so they read
the journal unchanged. The fold loop (app/maintenance/counters.py, ``queue_counts_fold`` and
``queue_throughput_fold`` in app/store/sql/queues.sql) replaces a bounded batch of rows by their
sums in one statement every couple of seconds, so the journal stays small. A fold is one
``DELETE ... RETURNING`` feeding an ``INSERT`` of the sums: a reader sees either the rows or
their sum, never both, and rows appended meanwhile are not in the fold's snapshot and stay.

``shard`` stays (always 0 now): the previous release's statements name it (its throughput prune
does), so instances of both can run against this schema during a rolling deploy.
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0022"
down_revision: str | None = "0021"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_INSERTED = """
CREATE OR REPLACE FUNCTION jobq_counts_inserted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO queue_counts (queue, status, jobs)
    SELECT queue, status, count(*) FROM jobq_new GROUP BY queue, status;
    RETURN NULL;
END $$
"""

# One statement: the moves of the statement's rows (a heartbeat moves none and appends nothing),
# the outcomes among them, and the signed counts. A data-modifying CTE so that plpgsql plans and
# runs one statement per call, not two. No nested loop: plpgsql keeps the plan it made for the
# first call, whose transition tables may have held one row, and a nested loop of old and new
# rows reused for a bulk update of 10,000 would be quadratic.
_UPDATED = """
CREATE OR REPLACE FUNCTION jobq_counts_updated() RETURNS trigger LANGUAGE plpgsql
SET enable_nestloop TO 'off' AS $$
BEGIN
    WITH moved AS MATERIALIZED (
        SELECT o.queue AS old_queue, o.status AS old_status, n.queue, n.status,
               n.lease_ended_by
        FROM jobq_old o JOIN jobq_new n ON n.id = o.id
        WHERE n.status <> o.status OR n.queue <> o.queue
    ),
    outcomes AS (
        INSERT INTO queue_throughput (queue, minute, outcome, jobs)
        SELECT queue, date_trunc('minute', now()),
               CASE WHEN status IN ('succeeded', 'dead', 'cancelled') THEN status
                    ELSE 'failed' END,
               count(*)
        FROM moved
        WHERE status <> old_status
          AND (status IN ('succeeded', 'dead', 'cancelled')
               OR (old_status = 'running' AND lease_ended_by IN ('fail', 'expire', 'timeout')))
        GROUP BY 1, 2, 3
    )
    INSERT INTO queue_counts (queue, status, jobs)
    SELECT old_queue, old_status, -count(*) FROM moved GROUP BY 1, 2
    UNION ALL
    SELECT queue, status, count(*) FROM moved GROUP BY 1, 2;
    RETURN NULL;
END $$
"""

_DELETED = """
CREATE OR REPLACE FUNCTION jobq_counts_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO queue_counts (queue, status, jobs)
    SELECT queue, status, -count(*) FROM jobq_old GROUP BY queue, status;
    RETURN NULL;
END $$
"""

# As migrations 0006 and 0010 left them (a migration keeps its own copy).
_SHARD_BEFORE = """
CREATE OR REPLACE FUNCTION jobq_counter_shard() RETURNS smallint
LANGUAGE sql STABLE PARALLEL SAFE AS $$ SELECT (pg_backend_pid() % 16)::smallint $$
"""

_INSERTED_BEFORE = """
CREATE OR REPLACE FUNCTION jobq_counts_inserted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO queue_counts AS c (queue, status, shard, jobs)
    SELECT queue, status, jobq_counter_shard(), count(*)
    FROM jobq_new GROUP BY queue, status ORDER BY queue, status
    ON CONFLICT (queue, status, shard) DO UPDATE SET jobs = c.jobs + EXCLUDED.jobs;
    RETURN NULL;
END $$
"""

_UPDATED_BEFORE = """
CREATE OR REPLACE FUNCTION jobq_counts_updated() RETURNS trigger LANGUAGE plpgsql
SET enable_nestloop TO 'off' AS $$
BEGIN
    INSERT INTO queue_counts AS c (queue, status, shard, jobs)
    SELECT queue, status, jobq_counter_shard(), sum(delta)
    FROM (
        SELECT queue, status, -1 AS delta FROM jobq_old
        UNION ALL
        SELECT queue, status, 1 FROM jobq_new
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

_DELETED_BEFORE = """
CREATE OR REPLACE FUNCTION jobq_counts_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO queue_counts AS c (queue, status, shard, jobs)
    SELECT queue, status, jobq_counter_shard(), -count(*)
    FROM jobq_old GROUP BY queue, status ORDER BY queue, status
    ON CONFLICT (queue, status, shard) DO UPDATE SET jobs = c.jobs + EXCLUDED.jobs;
    RETURN NULL;
END $$
"""


def upgrade() -> None:
    op.execute("ALTER TABLE queue_counts DROP CONSTRAINT pk_queue_counts")
    op.execute("ALTER TABLE queue_counts ALTER COLUMN shard SET DEFAULT 0")
    op.execute("ALTER TABLE queue_throughput DROP CONSTRAINT pk_queue_throughput")
    op.execute("ALTER TABLE queue_throughput ALTER COLUMN shard SET DEFAULT 0")
    op.execute(_INSERTED)
    op.execute(_UPDATED)
    op.execute(_DELETED)
    op.execute("DROP FUNCTION jobq_counter_shard()")


def downgrade() -> None:
    # Back to one row per (queue, state, shard): fold everything into shard 0 first.
    op.execute(
        """
        WITH folded AS (DELETE FROM queue_counts RETURNING queue, status, jobs)
        INSERT INTO queue_counts (queue, status, shard, jobs)
        SELECT queue, status, 0, sum(jobs) FROM folded GROUP BY queue, status
        """
    )
    op.execute(
        """
        WITH folded AS (DELETE FROM queue_throughput RETURNING queue, minute, outcome, jobs)
        INSERT INTO queue_throughput (queue, minute, outcome, shard, jobs)
        SELECT queue, minute, outcome, 0, sum(jobs) FROM folded GROUP BY queue, minute, outcome
        """
    )
    op.execute("ALTER TABLE queue_counts ALTER COLUMN shard DROP DEFAULT")
    op.execute("ALTER TABLE queue_throughput ALTER COLUMN shard DROP DEFAULT")
    op.execute(
        "ALTER TABLE queue_counts ADD CONSTRAINT pk_queue_counts PRIMARY KEY (queue, status, shard)"
    )
    op.execute(
        "ALTER TABLE queue_throughput ADD CONSTRAINT pk_queue_throughput "
        "PRIMARY KEY (queue, minute, outcome, shard)"
    )
    op.execute(_SHARD_BEFORE)
    op.execute(_INSERTED_BEFORE)
    op.execute(_UPDATED_BEFORE)
    op.execute(_DELETED_BEFORE)
