"""The statistics loop: ANALYZE ``jobs`` on servers where autovacuum does not.

The hot pool plans each statement once per connection (``force_generic_plan``), from the
planner's statistics of ``jobs``. Autovacuum keeps them fresh (migration 0008 asks it to
analyze ``jobs`` after 2 % of it changed); a server running without autovacuum never does, and
with no statistics the planner guesses a queue holds about one pending job, which made claims
sort the whole backlog (docs/adr/0010-analyze-where-autovacuum-does-not.md has the figures).

So the leader checks every few seconds and runs ``ANALYZE jobs`` itself when autovacuum is off
(for the server or the table) and more than 1,000 rows plus a tenth of the table changed since
the last analyze. ANALYZE reads a sample (at most 30,000 rows by default), takes no lock that
blocks reads or writes, and its new statistics make each connection plan its statements again.
Where autovacuum runs, the loop only reads one row of ``pg_stat_user_tables``.
"""

from __future__ import annotations

from app.maintenance.runner import TickLoop
from app.queue.services import Services

# PostgreSQL's statistics views lag the writes by up to a second or so: checking more often
# than this would see the same counts.
STATISTICS_INTERVAL_SECONDS = 5.0


class JobStatistics(TickLoop):
    """Keeps the planner's statistics of ``jobs`` fresh where autovacuum does not."""

    name = "statistics"
    leader_only = True

    def __init__(
        self, *, services: Services, interval_seconds: float = STATISTICS_INTERVAL_SECONDS
    ) -> None:
        super().__init__(services=services, interval_seconds=interval_seconds)

    async def run_batch(self) -> int:
        """One check; answers 1 when it analyzed ``jobs``."""
        return int(await self.services.upkeep.refresh_statistics())
