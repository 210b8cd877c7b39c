"""Workflow creates take an idempotency key

Revision ID: 0026
Revises: 0025
Create Date: 2026-12-07

``POST /v1/workflows`` takes an ``idempotency_key`` (body field or ``Idempotency-Key`` header),
so a client whose answer was lost can send the create again (issue 40, item 6):

- ``workflows.idempotency_key``: the key, or NULL (a workflow made without one);
- ``workflows.idempotency_hash``: the fingerprint of the request that made it (SHA-256 of its
  canonical JSON without the key, app/api/new_jobs.py), to tell a replay (same request: the
  workflow is answered, 200) from a reuse (another request: 422);
- ``uq_workflows_idempotency_key``: one workflow per key, across all workflows. The create is
  ``INSERT ... ON CONFLICT DO NOTHING`` on it (app/store/sql/workflows.sql): of two creates
  with one key at once, the second waits for the first's transaction and then finds its row,
  so a race makes one workflow. A key is remembered as long as its workflow row: until every
  step's job is pruned or deleted and the pruner deletes the workflow.

Rolling deploys: both columns are nullable and the index is partial; the previous release's
create leaves them NULL (its workflows take no key) and its reads select ``*`` into records
that ignore columns they do not know. The table holds one small row per workflow, so building
the index (which blocks its writes meanwhile) is brief.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0026"
down_revision: str | None = "0025"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("workflows", sa.Column("idempotency_key", sa.Text(), nullable=True))
    op.add_column("workflows", sa.Column("idempotency_hash", sa.Text(), nullable=True))
    op.create_index(
        "uq_workflows_idempotency_key",
        "workflows",
        ["idempotency_key"],
        unique=True,
        postgresql_where=sa.text("idempotency_key IS NOT NULL"),
    )


def downgrade() -> None:
    op.drop_index("uq_workflows_idempotency_key", table_name="workflows")
    op.drop_column("workflows", "idempotency_hash")
    op.drop_column("workflows", "idempotency_key")
