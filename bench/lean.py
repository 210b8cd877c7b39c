"""The lean queue table: the raw-SQL baseline's statements on a table holding only what they need.

The raw-SQL baseline (``bench/baseline.py``) runs on jobq's own ``jobs`` table, so it pays for
the schema as jobq does: statement-level triggers keeping per-queue and flow-control counts, row
triggers whose conditions test each finished row (waiters, webhooks, dependents), over fifteen
indexes (GIN over the payload, BRIN over created_at, the listings', the reaper's, the pruner's)
and some 45 columns a row. ``python -m bench`` runs the same workloads, with the very same
statement text, a second time on this table, in a database of its own on the same server, so
the table can say what the schema costs (raw on jobq's schema ÷ raw on the lean table) apart
from what HTTP and the service cost (jobq ÷ raw on its schema).

The table holds the columns those statements write or read, and nothing else: what a queue
with leases needs (queue, type, payload, priority, status, attempts, max_attempts, run_at, the
lease: lease_id, worker_id, lease_expires_at, lease_seconds; created_at, started_at,
finished_at), plus ``lease_ended_by``, a short text the completion writes, kept only so the
statements stay identical. Its primary key and one partial index in claim order (the same as
jobq's ``ix_jobs_claimable``) are its only indexes; it has no check constraint and no trigger.
Its table is called ``jobs``, as jobq's is, so the load process runs ``raw-enqueue`` and
``raw-drain`` against it unchanged and ``bench/checks.py`` verifies its runs as it does jobq's.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from bench import checks, databases

TABLE = """
CREATE TABLE jobs (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue text NOT NULL,
    type text NOT NULL,
    payload jsonb NOT NULL,
    priority int NOT NULL DEFAULT 0,
    status text NOT NULL DEFAULT 'pending',
    attempts int NOT NULL DEFAULT 0,
    max_attempts int NOT NULL,
    run_at timestamptz NOT NULL DEFAULT now(),
    lease_id uuid,
    worker_id text,
    lease_expires_at timestamptz,
    lease_seconds int NOT NULL,
    lease_ended_by text,
    created_at timestamptz NOT NULL DEFAULT now(),
    started_at timestamptz,
    finished_at timestamptz
)
"""
CLAIM_INDEX = """
CREATE INDEX jobs_claimable ON jobs (queue, priority DESC, run_at, id) WHERE status = 'pending'
"""
SUMMARY = "jobs: 17 columns, primary key + partial claim index, no triggers"


class Lean:
    """The lean table's database as the orchestrator sees it: the load's target, emptying,
    checks."""

    name = "lean"  # its figures' key in each row
    workload = "raw"  # the load process runs bench/baseline.py's raw-enqueue and raw-drain on it

    def __init__(self, *, dsn: str, database: str, admin: Any) -> None:
        self.dsn = dsn
        self.database = database
        self.admin = admin  # one asyncpg connection to the lean database

    def runs(self, *, max_jobs: int, keys: int) -> bool:
        """Every row but those with concurrency keys: jobq's schema baseline stands for those."""
        return keys == 0

    def describe(self) -> dict[str, str]:
        """What the settings block and the JSON say about the lean table."""
        return {"database": self.database, "table": SUMMARY}

    async def truncate(self) -> None:
        """Empties the table."""
        await self.admin.execute("TRUNCATE jobs")

    async def queued_ids(self) -> set[int]:
        """The ids of the jobs in the table."""
        return {row["id"] for row in await self.admin.fetch("SELECT id FROM jobs")}

    async def check_enqueue(self, result: dict[str, Any], n: int) -> list[str]:
        """Every job sent and answered once; the table holds exactly those rows."""
        return await checks.enqueue(self.admin, result, n)

    async def check_drain(self, result: dict[str, Any], preloaded: set[int]) -> list[str]:
        """Each pre-loaded job completed once, claimed once and succeeded; none left."""
        return await checks.drain(self.admin, result, len(preloaded))


@contextlib.asynccontextmanager
async def lean(dsn: str) -> AsyncIterator[Lean]:
    """A fresh database next to ``dsn``'s on the same server, with the lean table; dropped after."""
    async with databases.sibling(dsn, "lean") as (name, lean_dsn):
        admin = await databases.connect(lean_dsn)
        try:
            await admin.execute(TABLE)
            await admin.execute(CLAIM_INDEX)
            yield Lean(dsn=lean_dsn, database=name, admin=admin)
        finally:
            await admin.close()
