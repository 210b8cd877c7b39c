"""Running slots given back through an append-only journal, folded by the claims

Revision ID: 0023
Revises: 0022
Create Date: 2026-12-04

Until now a job leaving ``running`` gave its concurrency slots back by locking its
``flow_state`` rows ``FOR UPDATE`` and decrementing ``running`` (migration 0011's trigger).
Measured on the bench's keyed drain (issue 22: 16 workers, 20 keys under a limit that never
binds): every claim of 50 locks all 20 key rows until its commit, and every complete of 50
waited for them in turn. Sampling ``pg_stat_activity`` during that run found the complete
statement waiting on a row lock (``Lock:transactionid`` / ``Lock:tuple``) in about 80 % of the
samples of active backends; the keyed row ran at 0.18 of the unkeyed one.

Now a release only appends: one row per key a statement gave slots back in, with how many
(``flow_released``). No lock on ``flow_state``, so completes never wait for claims. The
claim that next locks a key's row deletes that key's journal rows (``DELETE ... RETURNING``:
exactly the rows it removed, never rows another claim already folded) and counts with
``running - released``; it writes the difference back. Rows appended by releases that have not
committed yet are not in the claim's snapshot, so a claim counts them as still running: it can
only under-use a slot for a moment, never give one twice. The pruner folds the rows of keys no
claim has locked lately. Readers count ``running`` minus the journal (``flow_running``).

A claim's own slots are still added by the trigger, on the rows the claim holds locked.

Rolling deploys: the previous release's claim reads ``flow_state.running`` without the journal,
so while it runs beside this one it counts released slots as running (it takes fewer jobs,
never more) until a claim of this release or the pruner folds them.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0023"
down_revision: str | None = "0022"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Net moves per flow_state row: a claim's +1s are added to the rows the claim holds locked; the
# -1s of jobs leaving running are appended to the journal and lock nothing.
_UPDATED = """
CREATE OR REPLACE FUNCTION jobq_flow_counted_updated() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    moved_keys text[];
    deltas int[];
BEGIN
    -- The common case, no job of the statement holds slots: a scan of each transition table.
    IF NOT EXISTS (SELECT 1 FROM jobq_old WHERE flow_keys IS NOT NULL AND status = 'running')
       AND NOT EXISTS (SELECT 1 FROM jobq_new WHERE flow_keys IS NOT NULL AND status = 'running')
    THEN
        RETURN NULL;
    END IF;
    -- A heartbeat moves nothing and writes nothing.
    SELECT array_agg(key ORDER BY key), array_agg(delta ORDER BY key) INTO moved_keys, deltas
    FROM (
        SELECT key, sum(delta)::int AS delta
        FROM (
            SELECT unnest(flow_keys) AS key, -1 AS delta FROM jobq_old
            WHERE flow_keys IS NOT NULL AND status = 'running'
            UNION ALL
            SELECT unnest(flow_keys), 1 FROM jobq_new
            WHERE flow_keys IS NOT NULL AND status = 'running'
        ) m
        GROUP BY key
        HAVING sum(delta) <> 0
    ) moves;
    IF moved_keys IS NULL THEN
        RETURN NULL;
    END IF;
    INSERT INTO flow_released (key, n)
    SELECT m.key, -m.delta FROM unnest(moved_keys, deltas) AS m(key, delta) WHERE m.delta < 0;
    IF EXISTS (SELECT 1 FROM unnest(deltas) AS d WHERE d > 0) THEN
        -- Only a claim takes slots, and it holds these rows already: no wait, no deadlock.
        PERFORM 1 FROM flow_state f
        WHERE f.key IN (SELECT m.key FROM unnest(moved_keys, deltas) AS m(key, delta)
                        WHERE m.delta > 0)
        ORDER BY f.key FOR UPDATE;
        UPDATE flow_state f
        SET running = f.running + m.delta, updated_at = now()
        FROM unnest(moved_keys, deltas) AS m(key, delta)
        WHERE f.key = m.key AND m.delta > 0;
    END IF;
    RETURN NULL;
END $$
"""

_DELETED = """
CREATE OR REPLACE FUNCTION jobq_flow_counted_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO flow_released (key, n)
    SELECT key, count(*)::int
    FROM (SELECT unnest(flow_keys) AS key FROM jobq_old
          WHERE flow_keys IS NOT NULL AND status = 'running') m
    GROUP BY key;
    RETURN NULL;
END $$
"""

_TRUNCATED = """
CREATE OR REPLACE FUNCTION jobq_flow_truncated() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM flow_state;
    DELETE FROM flow_released;
    RETURN NULL;
END $$
"""

# What each row holds running now: its count less the slots given back since a claim last
# folded them. Readers (the limits list, the held-back gauge, tests) use this, not the column.
_VIEW = """
CREATE VIEW flow_running AS
SELECT f.key,
       GREATEST(f.running - COALESCE(
           (SELECT sum(r.n) FROM flow_released r WHERE r.key = f.key), 0), 0)::int AS running
FROM flow_state f
"""

# As migration 0011 wrote them; a migration keeps its own copy.
_UPDATED_BEFORE = """
CREATE OR REPLACE FUNCTION jobq_flow_counted_updated() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    moved_keys text[];
    deltas int[];
BEGIN
    IF NOT EXISTS (SELECT 1 FROM jobq_old WHERE flow_keys IS NOT NULL AND status = 'running')
       AND NOT EXISTS (SELECT 1 FROM jobq_new WHERE flow_keys IS NOT NULL AND status = 'running')
    THEN
        RETURN NULL;
    END IF;
    SELECT array_agg(key ORDER BY key), array_agg(delta ORDER BY key) INTO moved_keys, deltas
    FROM (
        SELECT key, sum(delta)::int AS delta
        FROM (
            SELECT unnest(flow_keys) AS key, -1 AS delta FROM jobq_old
            WHERE flow_keys IS NOT NULL AND status = 'running'
            UNION ALL
            SELECT unnest(flow_keys), 1 FROM jobq_new
            WHERE flow_keys IS NOT NULL AND status = 'running'
        ) m
        GROUP BY key
        HAVING sum(delta) <> 0
    ) moves;
    IF moved_keys IS NULL THEN
        RETURN NULL;
    END IF;
    PERFORM 1 FROM flow_state f WHERE f.key = ANY (moved_keys) ORDER BY f.key FOR UPDATE;
    UPDATE flow_state f
    SET running = GREATEST(f.running + m.delta, 0), updated_at = now()
    FROM unnest(moved_keys, deltas) AS m(key, delta)
    WHERE f.key = m.key;
    RETURN NULL;
END $$
"""

_DELETED_BEFORE = """
CREATE OR REPLACE FUNCTION jobq_flow_counted_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM jobq_old WHERE flow_keys IS NOT NULL AND status = 'running')
    THEN
        RETURN NULL;
    END IF;
    PERFORM 1 FROM flow_state f
    WHERE f.key IN (SELECT unnest(flow_keys) FROM jobq_old
                    WHERE flow_keys IS NOT NULL AND status = 'running')
    ORDER BY f.key
    FOR UPDATE;
    UPDATE flow_state f
    SET running = GREATEST(f.running - moves.n, 0), updated_at = now()
    FROM (
        SELECT key, count(*)::int AS n
        FROM (SELECT unnest(flow_keys) AS key FROM jobq_old
              WHERE flow_keys IS NOT NULL AND status = 'running') m
        GROUP BY key
    ) moves
    WHERE f.key = moves.key;
    RETURN NULL;
END $$
"""

_TRUNCATED_BEFORE = """
CREATE OR REPLACE FUNCTION jobq_flow_truncated() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM flow_state;
    RETURN NULL;
END $$
"""


def upgrade() -> None:
    op.create_table(
        "flow_released",
        sa.Column("key", sa.Text(), nullable=False),
        sa.Column("n", sa.Integer(), nullable=False),
        sa.CheckConstraint("n > 0", name=op.f("ck_flow_released_n")),
    )
    op.create_index("ix_flow_released_key", "flow_released", ["key"])
    op.execute(_UPDATED)
    op.execute(_DELETED)
    op.execute(_TRUNCATED)
    op.execute(_VIEW)


def downgrade() -> None:
    op.execute("DROP VIEW flow_running")
    # Back to counts kept on the rows: fold the journal into them first.
    op.execute(
        """
        WITH folded AS (DELETE FROM flow_released RETURNING key, n)
        UPDATE flow_state f SET running = GREATEST(f.running - s.n, 0)
        FROM (SELECT key, sum(n)::int AS n FROM folded GROUP BY key) s
        WHERE f.key = s.key
        """
    )
    op.execute(_UPDATED_BEFORE)
    op.execute(_DELETED_BEFORE)
    op.execute(_TRUNCATED_BEFORE)
    op.drop_index("ix_flow_released_key", table_name="flow_released")
    op.drop_table("flow_released")
