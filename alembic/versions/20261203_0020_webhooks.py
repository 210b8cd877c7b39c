"""Completion webhooks: callback URLs, signing secrets, webhook_deliveries

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-03

- ``jobs.callback_url``: where the job's outcome is POSTed when it finishes (succeeded, dead,
  cancelled); NULL for every job without one. ``jobs.callback_key_id``: the API key that
  enqueued a job with a callback, whose webhook secret signs its deliveries (NULL without
  authentication, or for jobs without a callback). Both nullable without a default: catalog
  changes, no table rewrite, and a job without a callback stores two more null bits.
- ``queues.callback_url``: the queue's default, taken by a job that names none.
- ``api_keys.webhook_secret``: the key's signing secret, stored as is (it must sign, so it cannot
  be a hash; the bearer secret stays hashed in ``secret_sha256``). Generated for the existing
  keys and, through the column default, for keys an older release creates.
  ``webhook_secret_previous`` / ``webhook_secret_rotated_at``: after a rotation the previous
  secret signs too, for a grace period, so receivers can switch without losing deliveries.
- ``webhook_deliveries``: one row per finish of a job with a callback, written by the row trigger
  ``jobs_webhook_finished`` in the transaction of the finish itself, with the outcome as the
  finish left it (``body``). The delivery loop takes due rows (``ix_webhook_deliveries_due``),
  records each attempt and moves the row to delivered or failed.
- ``job_events``: ``webhook`` joins the kinds (one event per delivery attempt); ``audit_log``:
  ``key.rotate_webhook_secret`` joins the recorded actions.

Why a row trigger: the finish statements (complete, fail, cancel, the reaper) stay as they are,
and the trigger's ``WHEN`` condition is checked per changed row without calling the function
(as ``jobs_notify_finished`` of migration 0012 does), so a job without a callback pays one
null test per status change and nothing else.

Rolling deploys: code of 0019 never sets ``callback_url`` (its jobs have no callback) and
ignores the new columns (``SELECT *`` reads them, nothing shows them); its completions, fails,
cancels and reaps of a job a new instance enqueued with a callback still write the delivery,
since the trigger belongs to the database. Its ``GET /v1/jobs/{id}/events`` does not know the
``webhook`` kind: such a job's history answers an error on old instances until they are
replaced. Keys it creates get a secret from the column default.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0020"
down_revision: str | None = "0019"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

FINISHED = "('succeeded', 'dead', 'cancelled')"

# As app/models.py has them today; a migration keeps its own copy.
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
)
_KINDS_AFTER = (*_KINDS_BEFORE, "webhook")
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
)
_ACTIONS_AFTER = (*_ACTIONS_BEFORE, "key.rotate_webhook_secret")

# A fresh signing secret: 64 hex digits from two gen_random_uuid() (PostgreSQL's strong random
# source, 244 random bits), hashed; the default of api_keys.webhook_secret.
_NEW_SECRET = """
CREATE FUNCTION jobq_webhook_secret() RETURNS text LANGUAGE sql VOLATILE AS $$
    SELECT 'whsec_' || encode(sha256(convert_to(
        gen_random_uuid()::text || gen_random_uuid()::text, 'UTF8')), 'hex')
$$
"""

_WEBHOOK_FINISHED = """
CREATE FUNCTION jobq_webhook_finished() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    delivery uuid := gen_random_uuid();
BEGIN
    -- The outcome as this finish left it: a later retry and finish is a delivery of its own.
    INSERT INTO webhook_deliveries (id, job_id, url, key_id, body)
    VALUES (delivery, NEW.id, NEW.callback_url, NEW.callback_key_id,
            jsonb_build_object(
                'delivery_id', delivery,
                'event', 'job.finished',
                'job_id', NEW.id,
                'queue', NEW.queue,
                'type', NEW.type,
                'status', NEW.status,
                'result', NEW.result,
                'last_error', NEW.last_error,
                'attempts', NEW.attempts,
                'max_attempts', NEW.max_attempts,
                'finished_at', to_char(COALESCE(NEW.finished_at, now()) AT TIME ZONE 'UTC',
                                       'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')));
    RETURN NULL;
END $$
"""


def _kinds_check(kinds: Sequence[str]) -> None:
    op.drop_constraint(op.f("ck_job_events_kind"), "job_events", type_="check")
    op.create_check_constraint(
        op.f("ck_job_events_kind"),
        "job_events",
        "kind IN (" + ", ".join(f"'{k}'" for k in kinds) + ")",
    )


def _actions_check(actions: Sequence[str]) -> None:
    op.drop_constraint(op.f("ck_audit_log_action"), "audit_log", type_="check")
    op.create_check_constraint(
        op.f("ck_audit_log_action"),
        "audit_log",
        "action IN (" + ", ".join(f"'{a}'" for a in actions) + ")",
    )


def upgrade() -> None:
    op.add_column("jobs", sa.Column("callback_url", sa.Text(), nullable=True))
    op.add_column("jobs", sa.Column("callback_key_id", sa.BigInteger(), nullable=True))
    op.add_column("queues", sa.Column("callback_url", sa.Text(), nullable=True))
    op.execute(_NEW_SECRET)
    # A volatile default: each existing key gets a secret of its own (api_keys is small).
    op.add_column(
        "api_keys",
        sa.Column(
            "webhook_secret",
            sa.Text(),
            nullable=False,
            server_default=sa.text("jobq_webhook_secret()"),
        ),
    )
    op.add_column("api_keys", sa.Column("webhook_secret_previous", sa.Text(), nullable=True))
    op.add_column(
        "api_keys",
        sa.Column("webhook_secret_rotated_at", sa.DateTime(timezone=True), nullable=True),
    )
    op.create_table(
        "webhook_deliveries",
        sa.Column(
            "id",
            postgresql.UUID(as_uuid=True),
            server_default=sa.text("gen_random_uuid()"),
            nullable=False,
        ),
        sa.Column("job_id", sa.BigInteger(), nullable=False),
        sa.Column("url", sa.Text(), nullable=False),
        sa.Column("key_id", sa.BigInteger(), nullable=True),
        sa.Column("body", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("state", sa.Text(), server_default=sa.text("'pending'"), nullable=False),
        sa.Column("attempts", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column(
            "next_attempt_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("last_status", sa.Integer(), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("delivered_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column(
            "updated_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.CheckConstraint(
            "state IN ('pending', 'delivered', 'failed')", name=op.f("ck_webhook_deliveries_state")
        ),
        sa.CheckConstraint("attempts >= 0", name=op.f("ck_webhook_deliveries_attempts")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_webhook_deliveries")),
    )
    op.create_index(
        "ix_webhook_deliveries_due",
        "webhook_deliveries",
        ["next_attempt_at"],
        postgresql_where=sa.text("state = 'pending'"),
    )
    op.create_index("ix_webhook_deliveries_job_id", "webhook_deliveries", ["job_id"])
    op.create_index(
        "ix_webhook_deliveries_done",
        "webhook_deliveries",
        ["updated_at"],
        postgresql_where=sa.text("state <> 'pending'"),
    )
    op.execute(_WEBHOOK_FINISHED)
    op.execute(
        "CREATE TRIGGER jobs_webhook_finished AFTER UPDATE OF status ON jobs FOR EACH ROW "
        f"WHEN (NEW.callback_url IS NOT NULL AND NEW.status IN {FINISHED} "
        "AND OLD.status IS DISTINCT FROM NEW.status) "
        "EXECUTE FUNCTION jobq_webhook_finished()"
    )
    _kinds_check(_KINDS_AFTER)
    _actions_check(_ACTIONS_AFTER)


def downgrade() -> None:
    op.execute("DELETE FROM audit_log WHERE action = 'key.rotate_webhook_secret'")
    _actions_check(_ACTIONS_BEFORE)
    op.execute("DELETE FROM job_events WHERE kind = 'webhook'")
    _kinds_check(_KINDS_BEFORE)
    op.execute("DROP TRIGGER jobs_webhook_finished ON jobs")
    op.execute("DROP FUNCTION jobq_webhook_finished()")
    op.drop_table("webhook_deliveries")
    op.drop_column("api_keys", "webhook_secret_rotated_at")
    op.drop_column("api_keys", "webhook_secret_previous")
    op.drop_column("api_keys", "webhook_secret")
    op.execute("DROP FUNCTION jobq_webhook_secret()")
    op.drop_column("queues", "callback_url")
    op.drop_column("jobs", "callback_key_id")
    op.drop_column("jobs", "callback_url")
