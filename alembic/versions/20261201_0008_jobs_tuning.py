"""jobs storage parameters for a table updated constantly: fillfactor and autovacuum

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01

Every job is updated several times in its life (claim, each heartbeat, complete / fail / release,
or reap and promote) and its old versions are garbage at once. The defaults are tuned for tables
that mostly grow:

- ``fillfactor = 80``: inserts leave a fifth of each page free, so an update can put the new
  version on the row's own page. Only then can it be a HOT update (no index entries at all), and
  even an update that must touch the indexes dirties one heap page instead of two. With the
  indexes as they are, no update of ``jobs`` qualifies for HOT: claim and every terminal
  transition change ``status`` (in ``ix_jobs_queue_status_id`` and the partial indexes'
  predicates), and a heartbeat changes ``lease_expires_at`` (``ix_jobs_running_lease_expires_at``).
  ``bench/hot.py`` measures it: 0 % HOT on PostgreSQL 15 and 18 with or without this migration,
  but on 18 the updates whose new version had to go to another page fall from 67 % to 38 %
  (``n_tup_newpage_upd``). The price is a quarter more pages for rows that are never updated
  again (the finished history until the pruner deletes it). Only pages written from now on are
  filled to 80 %; existing pages stay as they are until rewritten (``VACUUM FULL``,
  ``CLUSTER``), which this migration does not do.
- ``autovacuum_vacuum_scale_factor = 0.02`` (default 0.2): vacuum after 2 % of the rows are dead
  instead of 20 %. A queue of a million finished jobs would otherwise accumulate 200,000 dead
  versions, bloating the claim and lease indexes that every worker walks, before a vacuum.
- ``autovacuum_vacuum_insert_scale_factor = 0.05`` (default 0.2): after a large enqueue, vacuum
  sooner to set the visibility map and freeze, so the backlog is not all vacuumed at once later.
- ``autovacuum_analyze_scale_factor = 0.02`` (default 0.1): the share of pending, running and
  finished rows moves fast, and the planner's choice of the partial indexes follows statistics.
- ``autovacuum_vacuum_cost_delay = 1`` ms (default 2 ms): the frequent vacuums of this table
  finish in about half the time; each is small, so the extra I/O rate is brief.

Setting or resetting these parameters takes a SHARE UPDATE EXCLUSIVE lock: reads and writes go
on, so this migration is safe to run under load. Rolling deploys: code of revision 0007 never
looks at storage parameters. Alembic's autogenerate does not compare them, so ``app/models.py``
only mentions them in a comment.
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

STORAGE_PARAMETERS = {
    "fillfactor": "80",
    "autovacuum_vacuum_scale_factor": "0.02",
    "autovacuum_vacuum_insert_scale_factor": "0.05",
    "autovacuum_analyze_scale_factor": "0.02",
    "autovacuum_vacuum_cost_delay": "1",
}


def upgrade() -> None:
    settings = ", ".join(f"{name} = {value}" for name, value in STORAGE_PARAMETERS.items())
    op.execute(f"ALTER TABLE jobs SET ({settings})")


def downgrade() -> None:
    op.execute(f"ALTER TABLE jobs RESET ({', '.join(STORAGE_PARAMETERS)})")
