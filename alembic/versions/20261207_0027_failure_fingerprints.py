"""Failure groups by error type and traceback fingerprint

Revision ID: 0027
Revises: 0026
Create Date: 2026-12-07

(Placeholder: filled in by issue 40's work.)
"""

from collections.abc import Sequence

revision: str = "0027"
down_revision: str | None = "0026"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    pass
