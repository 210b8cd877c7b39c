"""Concurrency keys and rate limits, enforced by the claim

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-01

- ``jobs.concurrency_key``: the job's key (``customer:42``), set at enqueue.
- ``ix_jobs_pending_concurrency_key``: pending jobs by key, partial, so only keyed jobs pay for
  it; the claim asks it whether an empty bucket's key has jobs waiting in the claimed queues.
- ``jobs.flow_keys``: the ``flow_state`` rows the current (or last) attempt holds a running slot
  in; written by the claim, read back when the job leaves ``running``. Recording it on the job
  makes every release match its claim exactly, whatever the limits became in between.
- ``flow_limits``: what the operators set: per key pattern or per queue pattern, a
  ``max_running`` and/or a token-bucket rate (``rate_limit`` claims per ``rate_per_seconds``).
- ``flow_state``: one row per limited key (``key:<concurrency_key>``) or queue (``queue:<name>``):
  how many of its jobs run now and its bucket's tokens as of ``refilled_at``. The claim locks
  these rows ``FOR UPDATE`` in key order, reads their newest version, grants and writes them in
  the same statement; ``max_running`` and the rate columns repeat the limit the last claim
  applied, and ``at_limit`` (generated) and ``blocked_until`` (when an emptied bucket has a
  token again) let a claim skip a full key's jobs before it locks anything, through two partial
  indexes that hold only such rows.
- ``jobq_flow_counted_updated()`` / ``_deleted()``: statement triggers that keep
  ``flow_state.running``: a claim that took slots adds them (while it still holds the rows'
  locks), and jobs leaving ``running`` (complete, fail, release, cancel, the reaper, a delete)
  give them back, locking the rows in the same key order as the claim, so the two never
  deadlock. A statement touching no job that holds slots costs a scan of its transition tables.
- ``audit_log``: limit changes join the recorded actions.

Rolling deploys: code of revision 0010 ignores the new columns; it never sets a key, and its
claim statement takes keyed jobs without limits (the trigger still releases nothing for them,
as such jobs record no ``flow_keys``).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0011"
down_revision: str | None = "0010"
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
)
_AFTER = (*_BEFORE, "limit.set", "limit.delete")

# Net running slots per flow_state row: every old running row that held slots gives them
# back, every new one takes them (a claim +1, a complete -1, a heartbeat 0), the way the state
# counters of migration 0006 count. No join of old and new rows, so no cached plan can turn
# quadratic on a large statement. The rows are locked in key order first, as the claim locks
# them, so the two never deadlock; the claim's own +1 comes while it still holds its locks.
_FLOW_COUNTED_UPDATED = """
CREATE FUNCTION jobq_flow_counted_updated() RETURNS trigger LANGUAGE plpgsql AS $$
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
    -- A heartbeat moves nothing and locks nothing.
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

_FLOW_COUNTED_DELETED = """
CREATE FUNCTION jobq_flow_counted_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
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

# TRUNCATE fires no row or statement trigger of UPDATE/DELETE: no job runs any more, so no row
# holds a slot (the state counters of migration 0006 are reset the same way).
_FLOW_TRUNCATED = """
CREATE FUNCTION jobq_flow_truncated() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM flow_state;
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
    op.add_column("jobs", sa.Column("concurrency_key", sa.Text(), nullable=True))
    op.add_column("jobs", sa.Column("flow_keys", postgresql.ARRAY(sa.Text()), nullable=True))
    op.create_index(
        "ix_jobs_pending_concurrency_key",
        "jobs",
        ["concurrency_key", "queue"],
        postgresql_where=sa.text("status = 'pending' AND concurrency_key IS NOT NULL"),
    )
    op.create_table(
        "flow_limits",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=True), nullable=False),
        sa.Column("scope", sa.Text(), nullable=False),
        sa.Column("pattern", sa.Text(), nullable=False),
        sa.Column("like_pattern", sa.Text(), nullable=False),
        sa.Column("max_running", sa.Integer(), nullable=True),
        sa.Column("rate_limit", sa.Integer(), nullable=True),
        sa.Column("rate_per_seconds", sa.Float(), nullable=True),
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
        sa.CheckConstraint("scope IN ('key', 'queue')", name=op.f("ck_flow_limits_scope")),
        sa.CheckConstraint(
            "max_running IS NOT NULL OR rate_limit IS NOT NULL", name=op.f("ck_flow_limits_some")
        ),
        sa.CheckConstraint(
            "(rate_limit IS NULL) = (rate_per_seconds IS NULL)", name=op.f("ck_flow_limits_rate")
        ),
        sa.CheckConstraint("max_running >= 1", name=op.f("ck_flow_limits_max_running")),
        sa.CheckConstraint(
            "rate_limit >= 1 AND rate_per_seconds > 0", name=op.f("ck_flow_limits_rate_positive")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_flow_limits")),
        sa.UniqueConstraint("scope", "pattern", name=op.f("uq_flow_limits_scope_pattern")),
    )
    op.create_table(
        "flow_state",
        sa.Column("key", sa.Text(), nullable=False),
        sa.Column("running", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("max_running", sa.Integer(), nullable=True),
        sa.Column("rate_limit", sa.Integer(), nullable=True),
        sa.Column("rate_per_seconds", sa.Float(), nullable=True),
        sa.Column("tokens", sa.Float(), nullable=True),
        sa.Column(
            "at_limit",
            sa.Boolean(),
            sa.Computed("running >= max_running", persisted=True),
            nullable=True,
        ),
        sa.Column("blocked_until", sa.DateTime(timezone=True), nullable=True),
        sa.Column(
            "refilled_at",
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
        sa.CheckConstraint("running >= 0", name=op.f("ck_flow_state_running")),
        sa.PrimaryKeyConstraint("key", name=op.f("pk_flow_state")),
    )
    # What a claim skips before it locks anything: keys and queues at their max_running, and
    # empty buckets until they refill; both indexes hold only such rows, however many keys exist.
    op.create_index(
        "ix_flow_state_at_limit", "flow_state", ["key"], postgresql_where=sa.text("at_limit")
    )
    op.create_index(
        "ix_flow_state_blocked_until",
        "flow_state",
        ["blocked_until"],
        postgresql_where=sa.text("blocked_until IS NOT NULL"),
    )
    _actions_check(_AFTER)
    op.execute(_FLOW_COUNTED_UPDATED)
    op.execute(_FLOW_COUNTED_DELETED)
    op.execute(_FLOW_TRUNCATED)
    op.execute(
        "CREATE TRIGGER jobs_flow_truncated AFTER TRUNCATE ON jobs "
        "FOR EACH STATEMENT EXECUTE FUNCTION jobq_flow_truncated()"
    )
    op.execute(
        "CREATE TRIGGER jobs_flow_counted_updated AFTER UPDATE ON jobs "
        "REFERENCING OLD TABLE AS jobq_old NEW TABLE AS jobq_new "
        "FOR EACH STATEMENT EXECUTE FUNCTION jobq_flow_counted_updated()"
    )
    op.execute(
        "CREATE TRIGGER jobs_flow_counted_deleted AFTER DELETE ON jobs "
        "REFERENCING OLD TABLE AS jobq_old "
        "FOR EACH STATEMENT EXECUTE FUNCTION jobq_flow_counted_deleted()"
    )


def downgrade() -> None:
    op.execute("DROP TRIGGER jobs_flow_truncated ON jobs")
    op.execute("DROP FUNCTION jobq_flow_truncated()")
    op.execute("DROP TRIGGER jobs_flow_counted_deleted ON jobs")
    op.execute("DROP TRIGGER jobs_flow_counted_updated ON jobs")
    op.execute("DROP FUNCTION jobq_flow_counted_deleted()")
    op.execute("DROP FUNCTION jobq_flow_counted_updated()")
    op.execute("DELETE FROM audit_log WHERE action IN ('limit.set', 'limit.delete')")
    _actions_check(_BEFORE)
    op.drop_table("flow_state")
    op.drop_table("flow_limits")
    op.drop_index("ix_jobs_pending_concurrency_key", table_name="jobs")
    op.drop_column("jobs", "flow_keys")
    op.drop_column("jobs", "concurrency_key")
