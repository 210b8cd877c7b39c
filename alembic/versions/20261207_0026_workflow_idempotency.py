"""Workflow creates take an idempotency key

Revision ID: 0026
Revises: 0025
Create Date: 2026-12-07

(Placeholder: filled in by issue 40's work.)
"""

from collections.abc import Sequence

revision: str = "0026"
down_revision: str | None = "0025"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    pass
