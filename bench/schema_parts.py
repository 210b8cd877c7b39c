"""What each part of jobq's schema costs the raw queue statements, one part left out at a time.

    python -m bench.schema_parts --dsn postgresql://postgres@127.0.0.1:5432/test [--rounds 3]
        [--protocol prepared|simple] [--variants full,bare,lean,...]

Issue 22 asks what each part of the ``jobs`` schema costs a claim, a complete and an enqueue.
This runs the raw-SQL baseline's statements (``bench/baseline.py``: claim then complete, one
job or 50 at a time; single inserts; 500-row inserts) under ``pgbench`` on copies of a database
migrated to jobq's head, each copy with one part removed: the counter triggers, the flow
trigger, the two (queue, state) listing indexes, the payload GIN, the BRIN, the row triggers,
all of those at once (``bare``), and on the lean queue table (``bench/lean.py``); ``capture``
drops both statement triggers that capture transition tables on UPDATE, ``ginslow`` turns the
payload GIN's pending list off. The ``lean+`` variants go the other way: the lean table with
the cheapest form of a part every production queue needs (``LEAN_PLUS``). Variants run interleaved within each round, each on a freshly
emptied table (pre-loaded, then VACUUM ANALYZE and a CHECKPOINT, for the drains); the figures
are medians of the rounds. Three tables: jobs/s; the WAL bytes a job wrote
(``pg_current_wal_lsn()`` around the run); and the CPU the server's processes spent a job,
read from /proc when the server runs on this machine (its postmaster's own, its live
children's, and its reaped children's cutime and cstime, read once pgbench's backends are
gone). WAL and CPU drift far less between runs than jobs/s on a shared machine. Speed is
reported, never asserted; the ratios within one run are what compare.

By default pgbench runs the statements as jobq's hot pool does (``app/db.py``): prepared once
per session, with ``plan_cache_mode = force_generic_plan`` and ``jit = off``. ``--protocol
simple`` sends each as text, parsed and planned on every call, as a client without prepared
statements does: there planning grows with the indexes a table has (every index is opened and
each partial index's predicate tested), which the hot pool never pays.

It needs ``pgbench`` on the PATH (Debian: ``postgresql-client``), creates databases named
``jobq_parts_*`` next to the DSN's and drops them at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg

from bench import procstat
from bench.lean import CLAIM_INDEX, TABLE

ROOT = Path(__file__).resolve().parent.parent

COUNTERS = [
    "ALTER TABLE jobs DISABLE TRIGGER jobs_counts_updated",
    "ALTER TABLE jobs DISABLE TRIGGER jobs_counts_inserted",
]
FLOW = ["ALTER TABLE jobs DISABLE TRIGGER jobs_flow_counted_updated"]
LISTING = ["DROP INDEX ix_jobs_queue_status_id", "DROP INDEX ix_jobs_queue_type_status_id"]
GIN = ["DROP INDEX ix_jobs_payload"]
BRIN = ["DROP INDEX ix_jobs_created_at"]
ROW_TRIGGERS = [
    f"ALTER TABLE jobs DISABLE TRIGGER {name}"
    for name in (
        "jobs_notify_finished",
        "jobs_webhook_finished",
        "jobs_linked_inserted",
        "jobs_linked_reopened",
        "jobs_linked_settled",
    )
]
# Each variant: the statements that remove its part from a copy of the migrated database.
VARIANTS: dict[str, list[str]] = {
    "full": [],
    "counters": COUNTERS,
    "flow": FLOW,
    "listing": LISTING,
    "gin": GIN,
    "brin": BRIN,
    "rowtrig": ROW_TRIGGERS,
    # Both statement triggers that capture transition tables on UPDATE: without only one of
    # them the other still captures every updated row, old and new.
    "capture": COUNTERS + FLOW,
    # The payload GIN without its pending list: each row's entries go straight into the tree.
    "ginslow": ["ALTER INDEX ix_jobs_payload SET (fastupdate = off)"],
    "bare": COUNTERS + FLOW + LISTING + GIN + BRIN + ROW_TRIGGERS,
}
LEAN = "lean"
# The lean table with the parts any queue with listings, lease expiry, pruning and exact counts
# needs, in their cheapest form, on the lean table alone: a listing index by queue and state, the
# reaper's and the pruner's partial indexes, and counts kept by a statement trigger that appends
# one netted row per (queue, state) moved. They say how far below the lean table a queue with
# those features starts, whatever the rest of its design (issue 22's target of 0.7).
_LISTING = "CREATE INDEX jobs_listing ON jobs (queue, status, id)"
_REAPER = "CREATE INDEX jobs_running ON jobs (lease_expires_at) WHERE status = 'running'"
_PRUNER = (
    "CREATE INDEX jobs_finished ON jobs (finished_at)"
    " WHERE status IN ('succeeded', 'dead', 'cancelled')"
)
_COUNTS = [
    "CREATE TABLE counts (queue text NOT NULL, status text NOT NULL, jobs bigint NOT NULL)",
    """CREATE FUNCTION counts_updated() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        INSERT INTO counts (queue, status, jobs)
        SELECT queue, status, sum(d) FROM (
            SELECT queue, status, -1 AS d FROM old_rows
            UNION ALL
            SELECT queue, status, 1 FROM new_rows
        ) moved
        GROUP BY queue, status HAVING sum(d) <> 0;
        RETURN NULL;
    END $$""",
    """CREATE FUNCTION counts_inserted() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        INSERT INTO counts (queue, status, jobs)
        SELECT queue, status, count(*) FROM new_rows GROUP BY queue, status;
        RETURN NULL;
    END $$""",
    "CREATE TRIGGER counts_updated AFTER UPDATE ON jobs"
    " REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows"
    " FOR EACH STATEMENT EXECUTE FUNCTION counts_updated()",
    "CREATE TRIGGER counts_inserted AFTER INSERT ON jobs REFERENCING NEW TABLE AS new_rows"
    " FOR EACH STATEMENT EXECUTE FUNCTION counts_inserted()",
]
LEAN_PLUS: dict[str, list[str]] = {
    "lean+listing": [_LISTING],
    "lean+counts": _COUNTS,
    "lean+essential": [_LISTING, _REAPER, _PRUNER, *_COUNTS],
}
LEANS = [LEAN, *LEAN_PLUS]

_CLAIM = """WITH picked AS (SELECT id FROM jobs WHERE queue = 'q' AND status = 'pending'
ORDER BY priority DESC, run_at, id LIMIT {n} FOR UPDATE SKIP LOCKED),
upd AS (UPDATE jobs j SET status = 'running', attempts = attempts + 1,
lease_id = gen_random_uuid(), worker_id = 'w', lease_expires_at = now() + interval '30 s',
started_at = now() FROM picked WHERE j.id = picked.id RETURNING j.id, j.lease_id)
SELECT array_agg(id)::text AS ids, array_agg(lease_id)::text AS lids FROM upd \\gset
UPDATE jobs SET status = 'succeeded', finished_at = now(), lease_ended_by = 'complete'
WHERE id = ANY(':ids'::bigint[]) AND lease_id = ANY(':lids'::uuid[]) AND status = 'running';
"""
_INSERT = """INSERT INTO jobs (queue, type, payload, priority, status, max_attempts,
lease_seconds, run_at) SELECT 'e', 'bench', jsonb_build_object('n', i), 0, 'pending', 10, 30,
now() FROM generate_series(1, {n}) i;
"""
PRELOAD = """INSERT INTO jobs (queue, type, payload, priority, status, max_attempts,
lease_seconds, run_at) SELECT 'q', 'bench', jsonb_build_object('n', i), 0, 'pending', 10, 30,
now() FROM generate_series(1, {n}) i"""


# (name, script, clients, transactions per client, jobs per transaction, jobs pre-loaded)
CASES = [
    ("claim+complete 1, 1 client", _CLAIM.format(n=1), 1, 1500, 1, 1500),
    ("claim+complete 1, 16 clients", _CLAIM.format(n=1), 16, 150, 1, 2400),
    ("claim+complete 50, 1 client", _CLAIM.format(n=50), 1, 60, 50, 3000),
    ("claim+complete 50, 16 clients", _CLAIM.format(n=50), 16, 6, 50, 4800),
    ("insert 500, 4 clients", _INSERT.format(n=500), 4, 10, 500, 0),
    ("insert 1, 16 clients", _INSERT.format(n=1), 16, 150, 1, 0),
]


def _dsn_of(dsn: str, database: str) -> str:
    return urlunsplit(urlsplit(dsn)._replace(path=f"/{database}"))


async def _admin(dsn: str, sql: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


# How pgbench sends the statements: "prepared" as jobq's hot pool does (app/db.py: one generic
# plan per statement, JIT off), "simple" as text planned on every call.
PROTOCOLS = {
    "prepared": "-c plan_cache_mode=force_generic_plan -c jit=off",
    "simple": "-c jit=off",
}


@contextlib.contextmanager
def _scripts(protocol: str) -> Iterator[dict[str, Path]]:
    with tempfile.TemporaryDirectory(prefix="jobq-parts-") as folder:
        paths = {}
        for index, (name, script, *_) in enumerate(CASES):
            path = Path(folder) / f"case{index}.sql"
            if protocol == "prepared":
                # A variable is bound as a parameter there, not pasted into the text as a literal.
                script = script.replace("':ids'", ":ids").replace("':lids'", ":lids")
            path.write_text(script)
            paths[name] = path
        yield paths


async def _databases(dsn: str, variants: list[str]) -> dict[str, str]:
    """A migrated template, one copy of it per variant with its part removed, and the lean
    table's database: answers each variant's DSN."""
    template = "jobq_parts_template"
    await _admin(dsn, f'DROP DATABASE IF EXISTS "{template}" WITH (FORCE)')
    await _admin(dsn, f'CREATE DATABASE "{template}"')
    subprocess.run(  # noqa: ASYNC221 - set-up, before anything is timed
        [sys.executable, "-m", "app.cli", "migrate"],
        cwd=ROOT,
        env={**os.environ, "DATABASE_URL": _dsn_of(dsn, template)},
        check=True,
        capture_output=True,
    )
    dsns = {}
    for variant in variants:
        name = f"jobq_parts_{variant}"
        await _admin(dsn, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        if variant in LEANS:
            await _admin(dsn, f'CREATE DATABASE "{name}"')
            for statement in [TABLE, CLAIM_INDEX, *LEAN_PLUS.get(variant, [])]:
                await _admin(_dsn_of(dsn, name), statement)
        else:
            await _admin(dsn, f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
            for statement in VARIANTS[variant]:
                await _admin(_dsn_of(dsn, name), statement)
        dsns[variant] = _dsn_of(dsn, name)
    await _admin(dsn, f'DROP DATABASE IF EXISTS "{template}" WITH (FORCE)')
    return dsns


def _postgres_cpu_seconds(postmaster: int | None) -> float | None:
    """CPU seconds the server has used: its postmaster's own and its exited children's (cutime,
    cstime), plus every live child's. ``None`` when the server is not on this machine."""
    if postmaster is None:
        return None
    fields = procstat.stat_fields(postmaster)
    if fields is None:
        return None
    # utime, stime, cutime, cstime: fields 14 to 17 of stat(5); the list starts at field 3.
    own = sum(int(v) for v in fields[11:15]) / procstat.CLOCK_TICKS
    children = procstat.descendants(postmaster)[1:]
    return own + sum(procstat.cpu_seconds(pid) for pid in children)


async def _postmaster(dsn: str) -> int | None:
    """The server's postmaster pid, when the server runs on this machine (its backend is ours)."""
    conn = await asyncpg.connect(dsn)
    try:
        backend = await conn.fetchval("SELECT pg_backend_pid()")
    finally:
        await conn.close()
    fields = procstat.stat_fields(int(backend))
    return int(fields[1]) if fields is not None else None


async def _reaped(postmaster: int | None, before: set[int], *, deadline: float = 10.0) -> None:
    """Waits until every server process started since ``before`` (pgbench's backends) is gone
    from /proc: an exited backend's CPU reaches its postmaster's cutime only once reaped, and
    until then is counted nowhere."""
    if postmaster is None:
        return
    for _ in range(int(deadline / 0.02)):  # a poll with a deadline: /proc sends no event
        if not set(procstat.descendants(postmaster)) - before:
            return
        await asyncio.sleep(0.02)


async def _wal_lsn(dsn: str) -> int:
    conn = await asyncpg.connect(dsn)
    try:
        return int(await conn.fetchval("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn"))
    finally:
        await conn.close()


async def _run_case(
    dsn: str,
    script: Path,
    clients: int,
    transactions: int,
    preload: int,
    postmaster: int | None,
    protocol: str,
) -> tuple[float, int, float | None]:
    """pgbench's transactions per second for one case on a freshly emptied table, with the WAL
    bytes and the server's CPU seconds the run took."""
    await _admin(dsn, "TRUNCATE jobs")
    if preload:
        await _admin(dsn, PRELOAD.format(n=preload))
    # A checkpoint first: each run then pays the same full-page images (the first change of
    # each page after a checkpoint logs the whole page), not whatever the previous run left.
    await _admin(dsn, "VACUUM ANALYZE jobs")
    await _admin(dsn, "CHECKPOINT")
    command = ["pgbench", "-n", "-M", protocol, "-c", str(clients), "-j", str(min(clients, 2))]
    command += ["-t", str(transactions), "-f", str(script), dsn]
    wal_before, cpu_before = await _wal_lsn(dsn), _postgres_cpu_seconds(postmaster)
    children_before = set(procstat.descendants(postmaster)) if postmaster is not None else set()
    done = await asyncio.to_thread(
        subprocess.run,
        command,
        env={**os.environ, "PGOPTIONS": PROTOCOLS[protocol]},
        capture_output=True,
        text=True,
    )
    await _reaped(postmaster, children_before)
    cpu_after, wal_after = _postgres_cpu_seconds(postmaster), await _wal_lsn(dsn)
    found = re.search(r"tps = ([\d.]+) \(without", done.stdout)
    if done.returncode != 0 or found is None:
        raise RuntimeError(f"pgbench failed: {done.stdout[-500:]} {done.stderr[-500:]}")
    cpu = None if cpu_before is None or cpu_after is None else cpu_after - cpu_before
    return float(found.group(1)), wal_after - wal_before, cpu


async def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", required=True, help="a PostgreSQL server (its databases stay)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--protocol",
        choices=list(PROTOCOLS),
        default="prepared",
        help="prepared, with generic plans, as jobq's hot pool (default); simple: planned each call",
    )
    parser.add_argument(
        "--variants",
        default=",".join([*VARIANTS, LEAN]),
        help=f"comma-separated, of {', '.join([*VARIANTS, *LEANS])}",
    )
    args = parser.parse_args(argv)
    variants = args.variants.split(",")
    unknown = set(variants) - {*VARIANTS, *LEANS}
    if unknown:
        parser.error(f"unknown variants: {', '.join(sorted(unknown))}")
    if shutil.which("pgbench") is None:
        parser.error("pgbench is not on the PATH")
    dsns = await _databases(args.dsn, variants)
    postmaster = await _postmaster(args.dsn)
    # (case, variant) -> per round: jobs/s, WAL bytes a job, server CPU microseconds a job.
    figures: dict[tuple[str, str], list[tuple[float, float, float | None]]] = {}
    try:
        with _scripts(args.protocol) as scripts:
            for _ in range(args.rounds):
                for name, _script, clients, transactions, per, preload in CASES:
                    jobs = clients * transactions * per
                    for variant in variants:
                        tps, wal, cpu = await _run_case(
                            dsns[variant],
                            scripts[name],
                            clients,
                            transactions,
                            preload,
                            postmaster,
                            args.protocol,
                        )
                        per_job_cpu = None if cpu is None else cpu / jobs * 1e6
                        figures.setdefault((name, variant), []).append(
                            (tps * per, wal / jobs, per_job_cpu)
                        )
    finally:
        for variant in variants:
            await _admin(args.dsn, f'DROP DATABASE IF EXISTS "jobq_parts_{variant}" WITH (FORCE)')
    print(f"medians of {args.rounds} rounds, {args.protocol} protocol; 'full' is jobq's schema,")
    print("each other column leaves out the part it names ('bare': all of them); 'lean' is")
    print("bench/lean.py's table, 'lean+…' that table with the parts LEAN_PLUS names")
    tables = [
        ("jobs/s", 0),
        ("WAL bytes per job (each run after a CHECKPOINT)", 1),
        ("PostgreSQL CPU microseconds per job (all its processes; n/a: not local)", 2),
    ]
    width = max(len(name) for name, *_ in CASES)
    column = max(10, *(len(v) + 2 for v in variants))
    for title, index in tables:
        print()
        print(title)
        print("case".ljust(width) + "".join(v.rjust(column) for v in variants))
        for name, *_ in CASES:
            row = name.ljust(width)
            for variant in variants:
                values = [v for r in figures[(name, variant)] if (v := r[index]) is not None]
                text = f"{statistics.median(values):,.0f}" if values else "n/a"
                row += text.rjust(column)
            print(row)


if __name__ == "__main__":
    asyncio.run(main())
