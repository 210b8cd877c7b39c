"""jobs.timeout_seconds: a maximum run time per attempt, separate from the lease

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Expand only: a nullable column; old code ignores it, new code treats NULL as "no limit".
    op.add_column("jobs", sa.Column("timeout_seconds", sa.Integer(), nullable=True))
    op.create_check_constraint(
        op.f("ck_jobs_timeout_seconds"), "jobs", "timeout_seconds BETWEEN 1 AND 604800"
    )


def downgrade() -> None:
    op.drop_constraint(op.f("ck_jobs_timeout_seconds"), "jobs", type_="check")
    op.drop_column("jobs", "timeout_seconds")
