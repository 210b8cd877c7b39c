"""Set-based cascades, pinned search paths, validated SQL enqueue, maintenance set-asides

Revision ID: 0025
Revises: 0024
Create Date: 2026-12-07

(Placeholder: filled in by issue 40's work.)
"""

from collections.abc import Sequence

revision: str = "0025"
down_revision: str | None = "0024"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    pass
