"""API keys, and the key that holds each lease

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01

- ``api_keys``: one row per key, holding the SHA-256 of its secret (never the secret), its role
  and its queue scopes. Keys are revoked (``revoked_at``), not deleted, so a revoked key's name
  stays taken and authentication stays on once any key was made.
- ``jobs.lease_key_id``: the key whose worker holds the current lease. Lease calls check it next
  to the worker id and the lease id, so a worker id is only unique within its key.

Rolling deploys: code of revision 0006 ignores both (it runs without authentication).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "api_keys",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=True), primary_key=True),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("role", sa.Text(), nullable=False),
        sa.Column("queues", sa.dialects.postgresql.ARRAY(sa.Text()), nullable=True),
        sa.Column("secret_sha256", sa.LargeBinary(), nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            nullable=False,
            server_default=sa.text("now()"),
        ),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(
            "role IN ('producer', 'worker', 'viewer', 'admin')", name=op.f("ck_api_keys_role")
        ),
        sa.UniqueConstraint("name", name=op.f("uq_api_keys_name")),
        sa.UniqueConstraint("secret_sha256", name=op.f("uq_api_keys_secret_sha256")),
    )
    op.add_column("jobs", sa.Column("lease_key_id", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    op.drop_column("jobs", "lease_key_id")
    op.drop_table("api_keys")
