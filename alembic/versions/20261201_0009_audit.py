"""Audit trail of admin actions

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01

- ``audit_log``: one row per accepted cancel, retry, pause or resume (written by the action's own
  statement) and per attempted key create or revoke: who (key name, ``anonymous`` or
  ``cli:<user>``), when (the database's ``now()``), what and the outcome. Listed newest first by
  id; ``(action, id)`` and ``(actor, id)`` serve the filtered listings.

Rolling deploys: code of revision 0008 never reads or writes the table (it records nothing).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# As app/models.py has them today; a migration keeps its own copy.
_ACTIONS = ("job.cancel", "job.retry", "queue.pause", "queue.resume", "key.create", "key.revoke")


def upgrade() -> None:
    op.create_table(
        "audit_log",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=True), nullable=False),
        sa.Column(
            "at", sa.DateTime(timezone=True), nullable=False, server_default=sa.text("now()")
        ),
        sa.Column("actor", sa.Text(), nullable=False),
        sa.Column("actor_key_id", sa.BigInteger(), nullable=True),
        sa.Column("action", sa.Text(), nullable=False),
        sa.Column("outcome", sa.Text(), nullable=False),
        sa.Column("queue", sa.Text(), nullable=True),
        sa.Column("job_id", sa.BigInteger(), nullable=True),
        sa.Column("key_name", sa.Text(), nullable=True),
        sa.Column("state_before", sa.Text(), nullable=True),
        sa.Column("state_after", sa.Text(), nullable=True),
        sa.Column("detail", postgresql.JSONB(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_audit_log")),
        sa.CheckConstraint(
            "action IN (" + ", ".join(f"'{a}'" for a in _ACTIONS) + ")",
            name=op.f("ck_audit_log_action"),
        ),
        sa.CheckConstraint(
            "outcome IN ('changed', 'unchanged', 'refused')", name=op.f("ck_audit_log_outcome")
        ),
    )
    op.create_index("ix_audit_log_action_id", "audit_log", ["action", "id"])
    op.create_index("ix_audit_log_actor_id", "audit_log", ["actor", "id"])


def downgrade() -> None:
    op.drop_table("audit_log")
