"""Awaiting a job's result

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-01

``GET /v1/jobs/{id}?wait_seconds=N`` long-polls until the job finishes, holding no database
connection: the read parks in its instance and is woken by the finish itself, on any instance.

- ``jobs.awaited``: somebody waits (or waited) for this job. A waiting read sets it with one
  conditional ``UPDATE ... WHERE status NOT IN (finished) RETURNING`` before it parks; it is
  never cleared. ``NOT NULL DEFAULT false`` is a metadata-only change (no table rewrite, no
  index), and the column is in no index, so setting it keeps the update HOT.
- ``jobq_notify_finished()`` and two row triggers calling it: ``jobs_notify_finished`` sends
  ``pg_notify('jobq_finished', id)`` when an awaited job reaches ``succeeded``, ``dead`` or
  ``cancelled``; ``jobs_notify_deleted`` when an awaited job that was not finished is deleted
  (its waiter then answers 404 at once). Each instance's control connection listens on the
  channel and wakes its waiters of that job.

Why only awaited jobs notify: a transaction that notifies takes a global lock while it
commits, which serialises the commits of all notifying transactions (app/wakeup/control.py),
so the hot statements never notify. The triggers' ``WHEN`` conditions are checked per changed
row without calling the function; a job nobody waits for never notifies. A waited job costs
one UPDATE when its wait starts and one NOTIFY when it finishes.

A deleted finished job does not notify: its waiters were told when it finished, and the jobs
that bulk deletes and the pruner delete are all finished (so they send nothing). A waiter whose
notification was lost anyway is found by the result backstop, which treats a job that is gone
like a finished one.

Rolling deploys: code of revisions 0010 and 0011 never sets ``awaited`` (it ignores the
``wait_seconds`` parameter and answers at once, so the client's wait loop becomes a polling
loop until the instance is replaced); it reads the column along with ``SELECT *`` and shows it
nowhere. Its completions, fails, cancels and reaps of a job a new instance waits for still
notify: the trigger belongs to the database.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

FINISHED = "('succeeded', 'dead', 'cancelled')"

_NOTIFY_FINISHED = """
CREATE FUNCTION jobq_notify_finished() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- The channel app/queue/results.py listens on; the payload is the job id.
    IF TG_OP = 'DELETE' THEN
        PERFORM pg_notify('jobq_finished', OLD.id::text);
    ELSE
        PERFORM pg_notify('jobq_finished', NEW.id::text);
    END IF;
    RETURN NULL;
END $$
"""


def upgrade() -> None:
    op.add_column(
        "jobs",
        sa.Column("awaited", sa.Boolean(), nullable=False, server_default=sa.text("false")),
    )
    op.execute(_NOTIFY_FINISHED)
    op.execute(
        "CREATE TRIGGER jobs_notify_finished AFTER UPDATE OF status ON jobs FOR EACH ROW "
        f"WHEN (NEW.awaited AND NEW.status IN {FINISHED} "
        "AND OLD.status IS DISTINCT FROM NEW.status) "
        "EXECUTE FUNCTION jobq_notify_finished()"
    )
    op.execute(
        "CREATE TRIGGER jobs_notify_deleted AFTER DELETE ON jobs FOR EACH ROW "
        f"WHEN (OLD.awaited AND OLD.status NOT IN {FINISHED}) "
        "EXECUTE FUNCTION jobq_notify_finished()"
    )


def downgrade() -> None:
    op.execute("DROP TRIGGER jobs_notify_deleted ON jobs")
    op.execute("DROP TRIGGER jobs_notify_finished ON jobs")
    op.execute("DROP FUNCTION jobq_notify_finished()")
    op.drop_column("jobs", "awaited")
