"""index finished jobs by finished_at, for the pruner's bounded batches

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index(
        "ix_jobs_finished_at",
        "jobs",
        ["finished_at"],
        postgresql_where=sa.text("status IN ('succeeded', 'cancelled', 'dead')"),
    )


def downgrade() -> None:
    op.drop_index("ix_jobs_finished_at", table_name="jobs")
