"""One index orders pending jobs: ix_jobs_pending_queue_run_at is dropped

Revision ID: 0024
Revises: 0023
Create Date: 2026-12-04

A queue's pending jobs were indexed twice: in claim order (``ix_jobs_claimable``: queue,
priority, run_at, id) and by due time (``ix_jobs_pending_queue_run_at``: queue, run_at), the
second only for the oldest pending job's age in ``GET /v1/queues`` and the long-poll backstop's
count. Both readers now use ``ix_jobs_claimable``: the oldest pending job is the oldest head
among the queue's priorities (one probe a priority with pending jobs), and the backstop counts
the queue's first rows in claim order.

What the second index cost (issue 22, raw statements under pgbench on jobq's schema, with and
without it, medians of 3): every job enqueued wrote one entry more, 105,000 against 116,000
jobs/s in batches of 500, 6,850 against 7,050 for 16 single inserts at once.

It was also a way for the claim to go wrong. The claim's walk names both its columns
(``queue = ... AND run_at <= now()``), and with no statistics on ``jobs`` (a server without
autovacuum, before any ANALYZE) the generic plan of the bench's 1 x 50 drain over 40,000 jobs
walked it and sorted the whole backlog, 24,300 rows for 50 jobs (``auto_explain``: 7 of 8.6 ms).
Without it that planner still finds a sorting plan through ``ix_jobs_queue_status_id``: the
statistics loop (app/maintenance/statistics.py) is what keeps such plans away.

Rolling deploys: the previous release's two readers still work without the index (they sort
the queue's pending rows instead of probing), for as long as both releases run.
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0024"
down_revision: str | None = "0023"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute("DROP INDEX IF EXISTS ix_jobs_pending_queue_run_at")


def downgrade() -> None:
    op.execute(
        "CREATE INDEX IF NOT EXISTS ix_jobs_pending_queue_run_at ON jobs (queue, run_at) "
        "WHERE status = 'pending'"
    )
