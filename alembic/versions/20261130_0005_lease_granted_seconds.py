"""jobs.lease_granted_seconds: the lease length of the current claim, the default for heartbeats

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-30
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Expand only: nullable; rows claimed by older code fall back to jobs.lease_seconds.
    op.add_column("jobs", sa.Column("lease_granted_seconds", sa.Integer(), nullable=True))


def downgrade() -> None:
    op.drop_column("jobs", "lease_granted_seconds")
