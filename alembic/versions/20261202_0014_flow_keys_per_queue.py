"""A concurrency key's slots and tokens are counted per queue

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-02

From this release the claim names a key's ``flow_state`` row ``key:<queue>|<concurrency_key>``
instead of ``key:<concurrency_key>`` (queue names hold no ``|``): the producers of one queue can
no longer use up the slots or tokens that another queue's jobs of the same key depend on. No
table changes; this revision moves what jobs running now hold to the new rows, so the limits
stay exact across the upgrade: it creates the new rows and rewrites the running jobs'
``flow_keys``, and the trigger of 0011 moves their running slots from the old rows to the new
ones in the same statement. Idle old rows are left to the pruner. Buckets start full in the new
rows (once per key and queue).

Rolling deploys: instances of 0013 still serving after the upgrade count the jobs they claim in
the old rows, so until they are replaced a key may run up to its limit in both sets of rows.
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_HOLDERS = (
    "status = 'running' AND flow_keys IS NOT NULL AND concurrency_key IS NOT NULL "
    "AND {old} = ANY (flow_keys)"
)


def _move(old: str, new: str) -> None:
    holders = _HOLDERS.format(old=old)
    op.execute(
        f"INSERT INTO flow_state (key) SELECT DISTINCT {new} FROM jobs WHERE {holders} "
        "ORDER BY 1 ON CONFLICT (key) DO NOTHING"
    )
    op.execute(
        f"UPDATE jobs SET flow_keys = ARRAY(SELECT CASE WHEN k = {old} THEN {new} ELSE k END "
        f"FROM unnest(flow_keys) AS k ORDER BY 1) WHERE {holders}"
    )


def upgrade() -> None:
    _move("'key:' || concurrency_key", "'key:' || queue || '|' || concurrency_key")


def downgrade() -> None:
    _move("'key:' || queue || '|' || concurrency_key", "'key:' || concurrency_key")
