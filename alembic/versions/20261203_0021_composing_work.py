"""Composing work: jobs that wait for other jobs, workflows, ordered keys

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-03

- A new state, ``waiting``: a job whose parents have not all finished, or whose ordering key's
  earlier job has not. Outside ``ix_jobs_claimable`` (pending only), so it costs claims nothing.
- ``jobs.depends_on`` (the parents' ids), ``jobs.on_parent_failure`` (``cancel``, the default,
  or ``run``), ``jobs.has_dependents`` (set on a parent when a child names it: the one flag the
  finish trigger looks at, so jobs without dependents pay no trigger call), ``jobs.ordering_key``,
  ``jobs.workflow_id`` and ``jobs.workflow_step``.
- ``workflows``: one row per ``POST /v1/workflows`` (its name, who made it, its step count).
- ``ordering_keys``: one row per (queue, ordering key), the lock a key's enqueues take turns
  on (a service enqueue locks its keys in order first); it holds no count, so a row an
  idempotent replay touched is harmless.
- Triggers, each with a ``WHEN`` condition so that other jobs never call them:
  - ``jobs_linked_inserted`` (BEFORE INSERT, jobs naming parents or an ordering key): locks the
    parents (a parent finishing concurrently is waited for, then seen finished), marks them
    ``has_dependents`` and decides the new job's state: waiting while a parent is unfinished,
    cancelled at once when a parent already failed and the job asks for success, as given
    otherwise. A parent that does not exist is refused (SQLSTATE 23503, column depends_on). An
    ordered job waits while any earlier job of its key is unfinished.
  - ``jobs_linked_reopened`` (BEFORE UPDATE, an ordered job leaving a finished state, e.g. an
    operator's retry): it waits when another job of its key is open.
  - ``jobs_linked_settled`` (AFTER UPDATE OF status / AFTER DELETE, a job with dependents or an
    ordering key entering a finished state, or deleted unfinished): in the same transaction,
    each waiting dependent whose parents have all ended as it asks becomes pending (scheduled
    when its run_at is ahead); dependents that need success are cancelled when the parent ended
    dead or cancelled (which cascades through this same trigger); the next waiting job of an
    ordering key becomes due once no job of the key is open (without the key's lock: an enqueue
    committing meanwhile is caught up by ``ordering_key_unstick``, app/store/sql/workflows.sql). Each move is written to
    ``job_events`` (``ready``, ``cancelled``) and a job made pending is announced on
    ``jobq_wakeup`` as ``jobq.enqueue()`` does (sender ``sql``).
- ``job_events.kind`` gains ``ready``; ``audit_log.action`` gains ``workflow.cancel`` and
  ``workflow.retry``.

Rolling deploys: instances on 0020's code neither write nor read the new columns; a waiting job
is invisible to their claims (they claim pending jobs only) and their listings show it as it is.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0021"
down_revision: str | None = "0020"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_STATES_BEFORE = "'pending', 'scheduled', 'running', 'succeeded', 'dead', 'cancelled'"
_STATES_AFTER = _STATES_BEFORE + ", 'waiting'"
_FINISHED = "('succeeded', 'dead', 'cancelled')"
_OPEN = "('waiting', 'scheduled', 'pending', 'running')"

# As app/models.py has them before this migration; a migration keeps its own copy.
_KINDS_BEFORE = (
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
    "webhook",
)
_KINDS_AFTER = (*_KINDS_BEFORE, "ready")
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
    "schedule.trigger",
    "key.rotate_webhook_secret",
)
_ACTIONS_AFTER = (*_ACTIONS_BEFORE, "workflow.cancel", "workflow.retry")

_LINKED_INSERTED = f"""
CREATE FUNCTION jobq_linked_inserted() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    wanted int;
    found_n int;
    failed_n int;
    open_n int;
BEGIN
    IF NEW.depends_on IS NOT NULL THEN
        NEW.depends_on := ARRAY(SELECT DISTINCT d FROM unnest(NEW.depends_on) AS d ORDER BY d);
        wanted := cardinality(NEW.depends_on);
        -- Lock the parents in id order: a parent finishing now is waited for, and its finish
        -- trigger, which runs after this transaction commits, sees this job. Each statement
        -- below reads a snapshot taken after the locks, so it sees that parent finished.
        PERFORM 1 FROM jobs WHERE id = ANY (NEW.depends_on) ORDER BY id FOR NO KEY UPDATE;
        UPDATE jobs SET has_dependents = true
        WHERE id = ANY (NEW.depends_on) AND NOT has_dependents;
        SELECT count(*),
               count(*) FILTER (WHERE status IN ('dead', 'cancelled')),
               count(*) FILTER (WHERE status NOT IN {_FINISHED})
          INTO found_n, failed_n, open_n
        FROM jobs WHERE id = ANY (NEW.depends_on);
        IF found_n < wanted THEN
            RAISE EXCEPTION 'depends_on: % of the % jobs named do not exist', wanted - found_n, wanted
                USING ERRCODE = '23503', COLUMN = 'depends_on';
        END IF;
        IF failed_n > 0 AND NEW.on_parent_failure IS DISTINCT FROM 'run' THEN
            NEW.status := 'cancelled';
            NEW.finished_at := now();
            INSERT INTO job_events (job_id, kind, data)
            VALUES (NEW.id, 'cancelled', jsonb_build_object(
                'status_before', 'waiting', 'reason', 'a parent ended dead or cancelled'));
        ELSIF open_n > 0 THEN
            NEW.status := 'waiting';
        END IF;
    END IF;
    IF NEW.ordering_key IS NOT NULL AND NEW.status NOT IN {_FINISHED} THEN
        -- The key's row is its lock: enqueues and finishes of one key take turns on it.
        INSERT INTO ordering_keys AS k (queue, ordering_key) VALUES (NEW.queue, NEW.ordering_key)
        ON CONFLICT (queue, ordering_key) DO UPDATE SET updated_at = now();
        IF EXISTS (SELECT 1 FROM jobs
                   WHERE queue = NEW.queue AND ordering_key = NEW.ordering_key
                     AND status IN {_OPEN}) THEN
            NEW.status := 'waiting';
        END IF;
    END IF;
    RETURN NEW;
END $$
"""

_LINKED_REOPENED = f"""
CREATE FUNCTION jobq_linked_reopened() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO ordering_keys AS k (queue, ordering_key) VALUES (NEW.queue, NEW.ordering_key)
    ON CONFLICT (queue, ordering_key) DO UPDATE SET updated_at = now();
    IF EXISTS (SELECT 1 FROM jobs
               WHERE queue = NEW.queue AND ordering_key = NEW.ordering_key AND id <> NEW.id
                 AND status IN {_OPEN}) THEN
        NEW.status := 'waiting';
    END IF;
    RETURN NEW;
END $$
"""

# A waiting job the trigger below made due: its history says after which job, and a pending one
# is announced on jobq_wakeup as jobq.enqueue() announces (sender "sql"), so waiting claims on
# every instance wake at once (the NOTIFY is sent at commit, dropped on rollback).
_LINKED_READY = """
CREATE FUNCTION jobq_linked_ready(ready_id bigint, ready_queue text, ready_status text,
                                  after_id bigint)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO job_events (job_id, kind, data)
    VALUES (ready_id, 'ready', jsonb_build_object('after', after_id, 'status', ready_status));
    IF ready_status = 'pending' THEN
        PERFORM pg_notify('jobq_wakeup', 'sql 1 ' || ready_queue);
    END IF;
END $$
"""

_LINKED_SETTLED = """
CREATE FUNCTION jobq_linked_settled() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    j jobs;
    ended text;
    child bigint;
    moved record;
BEGIN
    IF TG_OP = 'DELETE' THEN
        j := OLD;
        ended := 'cancelled';  -- a parent deleted before it finished never succeeds
    ELSE
        j := NEW;
        ended := NEW.status;
    END IF;

    IF j.has_dependents THEN
        FOR child IN
            SELECT c.id FROM jobs c
            WHERE c.depends_on @> ARRAY[j.id] AND c.status = 'waiting'
            ORDER BY c.id
            FOR NO KEY UPDATE
        LOOP
            IF ended <> 'succeeded' THEN
                -- Its own dependents are settled by this trigger on this update.
                UPDATE jobs c
                SET status = 'cancelled', finished_at = now(), updated_at = now()
                WHERE c.id = child AND c.status = 'waiting'
                  AND c.on_parent_failure IS DISTINCT FROM 'run';
                IF FOUND THEN
                    INSERT INTO job_events (job_id, kind, data)
                    VALUES (child, 'cancelled', jsonb_build_object(
                        'status_before', 'waiting', 'parent_id', j.id, 'parent_status', ended));
                    CONTINUE;
                END IF;
            END IF;
            -- Read after the lock: every parent finish committed before it is seen here.
            -- Parents are looked at newest first, one index probe each, stopping at the first
            -- one still open: parents mostly end in the order they were claimed, so a fan-in's
            -- finishes each cost a probe or two, not one per parent.
            UPDATE jobs c
            SET status = CASE WHEN c.run_at > now() THEN 'scheduled' ELSE 'pending' END,
                updated_at = now()
            WHERE c.id = child AND c.status = 'waiting'
              AND NOT EXISTS (
                  SELECT 1
                  FROM generate_subscripts(c.depends_on, 1, true) AS s(i)
                  CROSS JOIN LATERAL (SELECT p.status FROM jobs p
                                      WHERE p.id = c.depends_on[s.i]) p
                  WHERE p.status <> 'succeeded'
                    AND NOT (c.on_parent_failure = 'run' AND p.status IN ('dead', 'cancelled')))
            RETURNING c.id, c.queue, c.status INTO moved;
            IF FOUND THEN
                PERFORM jobq_linked_ready(moved.id, moved.queue, moved.status, j.id);
            END IF;
        END LOOP;
    END IF;

    -- The key's head ended (a waiting job leaving changes no turn): the next one's turn comes
    -- when no job of the key is open. No lock on the key's row here: a finish takes no lock
    -- beyond its own rows, so finishes and enqueues of several keys never wait for each other
    -- in opposite orders. An enqueue committing while this runs may add a waiting job this
    -- does not see; the enqueue's own check after its commit (ordering_key_unstick) and the
    -- promoter's sweep make such a job due.
    IF j.ordering_key IS NOT NULL AND (TG_OP = 'DELETE' OR OLD.status <> 'waiting') THEN
        IF NOT EXISTS (SELECT 1 FROM jobs
                       WHERE queue = j.queue AND ordering_key = j.ordering_key
                         AND status IN ('scheduled', 'pending', 'running')) THEN
            UPDATE jobs c
            SET status = CASE WHEN c.run_at > now() THEN 'scheduled' ELSE 'pending' END,
                updated_at = now()
            WHERE c.id = (SELECT n.id FROM jobs n
                          WHERE n.queue = j.queue AND n.ordering_key = j.ordering_key
                            AND n.status = 'waiting'
                          ORDER BY n.id LIMIT 1
                          FOR NO KEY UPDATE)
              AND c.status = 'waiting'
            RETURNING c.id, c.queue, c.status INTO moved;
            IF FOUND THEN
                PERFORM jobq_linked_ready(moved.id, moved.queue, moved.status, j.id);
            END IF;
        END IF;
    END IF;
    RETURN NULL;
END $$
"""


def _check(table: str, name: str, values: Sequence[str], column: str) -> None:
    op.drop_constraint(op.f(f"ck_{table}_{name}"), table, type_="check")
    op.create_check_constraint(
        op.f(f"ck_{table}_{name}"),
        table,
        f"{column} IN (" + ", ".join(f"'{v}'" for v in values) + ")",
    )


def upgrade() -> None:
    # Nullable columns and a constant default: catalog changes, no table rewrite.
    op.add_column("jobs", sa.Column("depends_on", postgresql.ARRAY(sa.BigInteger()), nullable=True))
    op.add_column("jobs", sa.Column("on_parent_failure", sa.Text(), nullable=True))
    op.add_column(
        "jobs",
        sa.Column("has_dependents", sa.Boolean(), server_default=sa.text("false"), nullable=False),
    )
    op.add_column("jobs", sa.Column("ordering_key", sa.Text(), nullable=True))
    op.add_column("jobs", sa.Column("workflow_id", sa.BigInteger(), nullable=True))
    op.add_column("jobs", sa.Column("workflow_step", sa.Text(), nullable=True))
    op.create_check_constraint(
        op.f("ck_jobs_on_parent_failure"), "jobs", "on_parent_failure IN ('cancel', 'run')"
    )
    op.drop_constraint(op.f("ck_jobs_status"), "jobs", type_="check")
    op.create_check_constraint(op.f("ck_jobs_status"), "jobs", f"status IN ({_STATES_AFTER})")
    # A parent's waiting dependents, found from the parent's id.
    op.create_index(
        "ix_jobs_depends_on",
        "jobs",
        ["depends_on"],
        postgresql_using="gin",
        postgresql_where=sa.text("depends_on IS NOT NULL"),
    )
    op.create_index(
        "ix_jobs_workflow_id",
        "jobs",
        ["workflow_id", "id"],
        postgresql_where=sa.text("workflow_id IS NOT NULL"),
    )
    # A key's open jobs in enqueue order: is any open, and which waits next.
    op.create_index(
        "ix_jobs_ordering_open",
        "jobs",
        ["queue", "ordering_key", "id"],
        postgresql_where=sa.text(f"ordering_key IS NOT NULL AND status IN {_OPEN}"),
    )
    op.create_table(
        "workflows",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=True), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("steps", sa.Integer(), nullable=False),
        sa.Column("created_by", sa.Text(), nullable=True),
        sa.Column("created_by_key_id", sa.BigInteger(), nullable=True),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_workflows")),
    )
    op.create_index("ix_workflows_created_at", "workflows", ["created_at"])
    op.create_table(
        "ordering_keys",
        sa.Column("queue", sa.Text(), nullable=False),
        sa.Column("ordering_key", sa.Text(), nullable=False),
        sa.Column(
            "updated_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.PrimaryKeyConstraint("queue", "ordering_key", name=op.f("pk_ordering_keys")),
    )
    op.create_index("ix_ordering_keys_updated_at", "ordering_keys", ["updated_at"])
    _check("job_events", "kind", _KINDS_AFTER, "kind")
    _check("audit_log", "action", _ACTIONS_AFTER, "action")

    op.execute(_LINKED_INSERTED)
    op.execute(_LINKED_REOPENED)
    op.execute(_LINKED_READY)
    op.execute(_LINKED_SETTLED)
    op.execute(
        "CREATE TRIGGER jobs_linked_inserted BEFORE INSERT ON jobs FOR EACH ROW "
        "WHEN (NEW.depends_on IS NOT NULL OR NEW.ordering_key IS NOT NULL) "
        "EXECUTE FUNCTION jobq_linked_inserted()"
    )
    op.execute(
        "CREATE TRIGGER jobs_linked_reopened BEFORE UPDATE OF status ON jobs FOR EACH ROW "
        f"WHEN (NEW.ordering_key IS NOT NULL AND OLD.status IN {_FINISHED} "
        f"AND NEW.status NOT IN {_FINISHED}) "
        "EXECUTE FUNCTION jobq_linked_reopened()"
    )
    op.execute(
        "CREATE TRIGGER jobs_linked_settled AFTER UPDATE OF status ON jobs FOR EACH ROW "
        "WHEN ((NEW.has_dependents OR NEW.ordering_key IS NOT NULL) "
        f"AND NEW.status IN {_FINISHED} AND OLD.status NOT IN {_FINISHED}) "
        "EXECUTE FUNCTION jobq_linked_settled()"
    )
    op.execute(
        "CREATE TRIGGER jobs_linked_deleted AFTER DELETE ON jobs FOR EACH ROW "
        "WHEN ((OLD.has_dependents OR OLD.ordering_key IS NOT NULL) "
        f"AND OLD.status NOT IN {_FINISHED}) "
        "EXECUTE FUNCTION jobq_linked_settled()"
    )


def downgrade() -> None:
    op.execute("DROP TRIGGER jobs_linked_deleted ON jobs")
    op.execute("DROP TRIGGER jobs_linked_settled ON jobs")
    op.execute("DROP TRIGGER jobs_linked_reopened ON jobs")
    op.execute("DROP TRIGGER jobs_linked_inserted ON jobs")
    op.execute("DROP FUNCTION jobq_linked_settled()")
    op.execute("DROP FUNCTION jobq_linked_ready(bigint, text, text, bigint)")
    op.execute("DROP FUNCTION jobq_linked_reopened()")
    op.execute("DROP FUNCTION jobq_linked_inserted()")
    op.execute("DELETE FROM audit_log WHERE action IN ('workflow.cancel', 'workflow.retry')")
    _check("audit_log", "action", _ACTIONS_BEFORE, "action")
    op.execute("DELETE FROM job_events WHERE kind = 'ready'")
    _check("job_events", "kind", _KINDS_BEFORE, "kind")
    op.drop_table("ordering_keys")
    op.drop_table("workflows")
    op.drop_index("ix_jobs_ordering_open", table_name="jobs")
    op.drop_index("ix_jobs_workflow_id", table_name="jobs")
    op.drop_index("ix_jobs_depends_on", table_name="jobs")
    # Jobs waiting for others go back to what older code knows: pending.
    op.execute("UPDATE jobs SET status = 'pending' WHERE status = 'waiting'")
    op.drop_constraint(op.f("ck_jobs_status"), "jobs", type_="check")
    op.create_check_constraint(op.f("ck_jobs_status"), "jobs", f"status IN ({_STATES_BEFORE})")
    op.drop_constraint(op.f("ck_jobs_on_parent_failure"), "jobs", type_="check")
    for column in (
        "workflow_step",
        "workflow_id",
        "ordering_key",
        "has_dependents",
        "on_parent_failure",
        "depends_on",
    ):
        op.drop_column("jobs", column)
