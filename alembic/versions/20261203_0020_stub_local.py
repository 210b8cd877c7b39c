"""LOCAL STUB until the webhooks branch merges (adds the 'webhook' event kind only)

Revision ID: 0020
Revises: 0019
"""

from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None

_K = (
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


def upgrade() -> None:
    op.drop_constraint(op.f("ck_job_events_kind"), "job_events", type_="check")
    op.create_check_constraint(
        op.f("ck_job_events_kind"),
        "job_events",
        "kind IN (" + ", ".join(f"'{k}'" for k in (*_K, "webhook")) + ")",
    )


def downgrade() -> None:
    op.drop_constraint(op.f("ck_job_events_kind"), "job_events", type_="check")
    op.create_check_constraint(
        op.f("ck_job_events_kind"),
        "job_events",
        "kind IN (" + ", ".join(f"'{k}'" for k in _K) + ")",
    )
