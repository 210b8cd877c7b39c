"""``python -m bench``: jobq against raw SQL on its schema and on a lean queue table, verified.

    python -m bench                         # embedded PostgreSQL, 1 instance, 20,000 jobs, 3 rounds
    python -m bench --smoke                 # a few hundred jobs, 1 round, short soak (< 1 minute)
    python -m bench --dsn postgresql://postgres@127.0.0.1:5432/postgres   # another server
    python -m bench --instances 2           # two `jobq serve` instances (scale-out)
    python -m bench --json bench.json       # also write every figure as JSON
    python -m bench --peers                 # also PGQueuer and Procrastinate in process
                                            #   (pip install -e '.[bench]')
    python -m bench --only chain,fanin      # only the composed-work rows (issue 21)

It creates a fresh database (on the embedded PostgreSQL, or on ``--dsn``'s server, and drops it
afterwards), migrates it, starts ``--instances`` real `jobq serve` processes on free ports and
prints the settings it runs with. The load always comes from a separate process
(``python -m bench.load``, a lean HTTP/1.1 client on asyncio streams, or asyncpg for the raw-SQL
baseline), which reports its own CPU and that of the servers for each run.

Each row of the table runs one workload against three targets, interleaved, in the same run
(median over ``--rounds``): jobq over HTTP; raw SQL (``bench/baseline.py``: asyncpg, one
autocommit statement per step) on jobq's own schema, in the same database, its triggers,
counters and indexes firing as they do for jobq ("schema"); and the very same statements on a
lean queue table (``bench/lean.py``: the columns they touch, a primary key, one partial claim
index, no triggers) in a database of its own on the same server ("lean"). The first table
prints the three jobs/s and jobq ÷ lean (all that jobq costs over the leanest queue on this
PostgreSQL), jobq ÷ schema (what HTTP and the service cost) and schema ÷ lean (what the schema
costs the same statements). The rows with concurrency keys run on jobq's schema only. The second
table prints what each job cost: the servers' CPU per request, the load process's share of the
machine, commits (and statement calls, when ``pg_stat_statements`` is loaded) per job on the
jobq database, and transaction ids per job. With ``--peers`` each row also runs through PGQueuer
and Procrastinate in the load process, each on a database of its own on the same server, and the
first table adds their jobs/s and jobq ÷ each (Procrastinate fetches one job per statement, so
it runs only the rows claiming one job at a time, without concurrency keys).
Then the composed-work rows (``bench/composed_suite.py``): a 3-step chain (workflows a -> b -> c)
and a 100-way fan-in (a batch of 100 with a callback), each against the application doing the
same chaining and counting in raw SQL, with units/s, jobs/s and end-to-end latency p50/p95.
Then: enqueue-to-claim latency with idle long-pollers, claim latency on an empty and on a long
history (1,000,000 finished rows) with their ratio, and a soak with each instance's RSS growth
and PostgreSQL's backends. Last, one client claims (max_jobs 1) and completes pre-loaded jobs,
each request timed, without API keys and then with an admin key: claim and complete p50/p99 and
the servers' CPU per request, with keys less without. Authentication never turns off in a
running instance, so every round without keys runs before the key is made. Every run is
verified against the database; a failed check is printed and the command exits 1. Speed is
reported, never asserted. ``--only`` runs some of the sections (the table's rows, chain, fanin,
latency, history, soak, auth) instead of all.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.metadata
import os
import platform
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import asyncpg

from bench import composed_suite, lean, report
from bench.harness import JobqProcess, database, jobq_process, raw_dsn
from bench.suite import (
    HISTORY_TARGET_RATIO,
    LATENCY_POLLERS,
    ROWS,
    SOAK_PRODUCERS,
    SOAK_WORKERS,
    STATS_SETTLE_SECONDS,
    Options,
    Sibling,
    Suite,
    cores,
)

FULL = {
    "jobs": 20_000,
    "rounds": 3,
    "soak_seconds": 60.0,
    "history_rows": 1_000_000,
    "latency_jobs": 1000,
    "claim_samples": 2000,
    "auth_jobs": 2000,
    "chains": 500,
    "fanins": 30,
}
SMOKE = {
    "jobs": 600,
    "rounds": 1,
    "soak_seconds": 5.0,
    "history_rows": 20_000,
    "latency_jobs": 60,
    "claim_samples": 200,
    "auth_jobs": 300,
    "chains": 40,
    "fanins": 4,
}
# What --only may name, in the order they run.
SECTIONS = ("rows", "chain", "fanin", "latency", "history", "soak", "auth")
PG_SETTINGS = ("server_version", "synchronous_commit", "fsync", "shared_buffers", "max_connections")


def parser() -> argparse.ArgumentParser:
    """The command line."""
    p = argparse.ArgumentParser(
        prog="python -m bench", description=__doc__.split("\n")[0] if __doc__ else None
    )
    p.add_argument("--dsn", help="PostgreSQL server to use (a fresh database is made on it)")
    p.add_argument("--instances", type=int, default=1, help="jobq serve instances (default 1)")
    p.add_argument("--smoke", action="store_true", help="small and quick: checks it all runs")
    p.add_argument("--jobs", type=int, help="jobs per run (default 20,000; smoke 600)")
    p.add_argument("--rounds", type=int, help="repetitions per row (default 3; smoke 1)")
    p.add_argument("--soak-seconds", type=float, help="soak length (default 60; smoke 5)")
    p.add_argument(
        "--history-rows", type=int, help="finished rows seeded (default 1,000,000; smoke 20,000)"
    )
    p.add_argument("--latency-jobs", type=int, help="enqueue->claim samples (default 1000)")
    p.add_argument("--claim-samples", type=int, help="claim latency samples (default 2000)")
    p.add_argument(
        "--auth-jobs",
        type=int,
        help="claim+complete pairs per run, without and with API keys (default 2000; smoke 300)",
    )
    p.add_argument(
        "--chains", type=int, help="workflows a->b->c per chain run (default 500; smoke 40)"
    )
    p.add_argument(
        "--fanins",
        type=int,
        help="batches of 100 jobs with a callback per fan-in run (default 30; smoke 4)",
    )
    p.add_argument(
        "--only",
        type=sections,
        help=f"comma-separated sections to run, of: {','.join(SECTIONS)} (default: all)",
    )
    p.add_argument(
        "--rows",
        type=row_keys,
        help="comma-separated keys of the table's rows to run (e.g. drain_16_max50,"
        "drain_16_max50_keys; default: all)",
    )
    p.add_argument(
        "--settle-seconds",
        type=float,
        help=f"wait for PostgreSQL's statistics before reading commits (default "
        f"{STATS_SETTLE_SECONDS:g}; smoke 0: commits are not read)",
    )
    p.add_argument(
        "--batch-answer",
        choices=("ids", "jobs"),
        default="ids",
        help="what jobq's batch enqueues ask for: ids (?answer=ids, the lean answer a producer "
        "that needs no more asks for; default) or jobs (every job rendered, the full answer)",
    )
    p.add_argument("--json", type=Path, help="also write every figure to this JSON file")
    p.add_argument(
        "--peers",
        action="store_true",
        help="also run the table's rows through PGQueuer and Procrastinate in process "
        "(pip install -e '.[bench]')",
    )
    return p


def chosen(text: str, known: Sequence[str], what: str) -> tuple[str, ...]:
    """A comma-separated choice of ``known`` names (``what`` they are), in ``known``'s order."""
    named = {name.strip() for name in text.split(",") if name.strip()}
    if unknown := named - set(known):
        raise argparse.ArgumentTypeError(
            f"unknown {what}(s) {', '.join(sorted(unknown))}; choose from {', '.join(known)}"
        )
    if not named:
        raise argparse.ArgumentTypeError(f"name at least one {what}")
    return tuple(name for name in known if name in named)


def sections(text: str) -> tuple[str, ...]:
    """``--only``'s value: known section names, in the order they run."""
    return chosen(text, SECTIONS, "section")


def row_keys(text: str) -> tuple[str, ...]:
    """``--rows``' value: keys of the table's rows, in the table's order."""
    return chosen(text, [row.key for row in ROWS], "row")


PEERS = {"pgqueuer": "PGQueuer", "procrastinate": "Procrastinate"}  # package: name


def peer_versions() -> dict[str, str]:
    """The peers' versions by package, or exits saying how to install them (``--peers``)."""
    for package, name in PEERS.items():
        try:
            importlib.import_module(package)
        except ImportError as exc:
            raise SystemExit(
                f"--peers runs {name}, which is not importable here ({exc}); "
                "install it with: pip install -e '.[bench]'"
            ) from None
    return {package: importlib.metadata.version(package) for package in PEERS}


def options_from(args: argparse.Namespace) -> Options:
    """The sizes: the preset (full or smoke) with any explicit flag on top."""
    preset = SMOKE if args.smoke else FULL
    chosen: dict[str, Any] = {
        key: getattr(args, key) if getattr(args, key) is not None else default
        for key, default in preset.items()
    }
    return Options(
        **chosen,
        settle_seconds=(
            args.settle_seconds
            if args.settle_seconds is not None
            else (0.0 if args.smoke else STATS_SETTLE_SECONDS)
        ),
        smoke=args.smoke,
        peers=args.peers,
        batch_answer=args.batch_answer,
        sections=args.only or SECTIONS,
    )


async def pg_settings(admin: Any) -> dict[str, str]:
    """The PostgreSQL settings worth printing next to the figures."""
    return {name: await admin.fetchval(f"SHOW {name}") for name in PG_SETTINGS}


def pools(url: str) -> str:
    """The connection pools the servers run with (their settings, from this environment)."""
    from app.settings import Settings

    settings = Settings(database_url=url)
    sizes = {
        name: getattr(settings, name)
        for name in type(settings).model_fields
        if name.startswith("db_") and (name.endswith("pool_size") or name == "db_max_overflow")
    }
    return ", ".join(f"{name} {value}" for name, value in sizes.items())


def print_settings(settings: dict[str, Any]) -> None:
    """The settings block at the top of the output."""
    pg = settings["postgresql"]
    o = settings["options"]
    print("jobq benchmark: python -m bench" + (" --smoke" if o["smoke"] else ""))
    print(
        f"  PostgreSQL {pg['server_version']} ({settings['server']}), database {settings['database']}"
    )
    print(
        f"  synchronous_commit {pg['synchronous_commit']}, fsync {pg['fsync']}, "
        f"shared_buffers {pg['shared_buffers']}, max_connections {pg['max_connections']}"
    )
    print(
        f"  cores {settings['cores']}, Python {settings['python']}, JSON {settings['json']}; "
        f"jobq serve instances {settings['instances']} ({settings['pools']} each)"
    )
    print(
        f"  jobs {o['jobs']:,} per run, rounds {o['rounds']}, soak {o['soak_seconds']:g} s, "
        f"history {o['history_rows']:,} rows"
    )
    print(
        "  clients: enqueue single 1 and 16, batch of 500 with 4; drain 1, 4 and 16 workers "
        f"(max_jobs 1 and 50, wait_seconds 0); latency {LATENCY_POLLERS} long-pollers; "
        f"soak {SOAK_PRODUCERS} producers + {SOAK_WORKERS} workers; claim+complete 1 client "
        f"({o['auth_jobs']:,} jobs) without and with API keys"
    )
    pgss = settings["pg_stat_statements"]
    print(
        f"  composed: {o['chains']:,} chains a->b->c and {o['fanins']:,} fan-ins of "
        f"{composed_suite.FAN} per run; sections {','.join(o['sections'])}"
    )
    print(f"  pg_stat_statements: {'available' if pgss is None else f'unavailable ({pgss})'}")
    lean = settings["lean"]
    if lean:
        print(
            f"  lean queue table: database {lean['database']} on the same server ({lean['table']})"
        )
    peers = settings["peers"]
    if peers:
        pgqueuer, procrastinate = peers["pgqueuer"], peers["procrastinate"]
        print(
            f"  peers in the load process, each on its own database on the same server: "
            f"PGQueuer {pgqueuer['version']} ({pgqueuer['database']}, durability "
            f"{pgqueuer['durability']}), Procrastinate {procrastinate['version']} "
            f"({procrastinate['database']})"
        )
    print(flush=True)


def print_results(document: dict[str, Any]) -> None:
    """The table, then latency, history and soak lines, the notes and the verdict."""
    print()
    pgss = document["settings"]["pg_stat_statements"]
    peers = document["settings"]["peers"]
    if document["rows"]:
        titles = [(name, PEERS[name]) for name in peers or {}]
        print(report.table(document["rows"], with_calls=pgss is None, peers=titles))
    if document["composed"]:
        print()
        print("\n".join(composed_suite.lines(document["composed"])))
    latency = document["latency"]
    if latency:
        print()
        label = (
            f"enqueue->claim, {latency['pollers']} idle long-pollers (wait_seconds 20), "
            f"{latency['rate_per_s']:.0f} jobs/s"
        )
        print(report.latency_line(label, latency))
    history = document["history"]
    if "empty" in history and "long" in history:
        print(
            f"claim latency (max_jobs 1, backlog {history['backlog']}), empty history : "
            + report.latency_line("", history["empty"]).lstrip(": ")
        )
        print(
            f"claim latency after {history['history_rows']:,} finished rows"
            f" (inserted + ANALYZE in {history['insert_seconds']:.1f} s): "
            + report.latency_line("", history["long"]).lstrip(": ")
        )
        print(
            f"  long ÷ empty history: p50 {report.number(history['ratio_p50'], 2)}, "
            f"p99 {report.number(history['ratio_p99'], 2)} (target ≤ {HISTORY_TARGET_RATIO})"
        )
    soak = document["soak"]
    if soak:
        print(
            f"soak {soak['seconds']:g} s ({soak['producers']} producers, {soak['workers']} workers): "
            f"{soak['completed']:,} jobs, {report.number(soak['jobs_per_s'])} jobs/s, "
            f"server CPU {report.number(soak['server_cpu_ms_per_request'], 2)} ms/req"
        )
        for i, (start, end, growth) in enumerate(
            zip(
                soak["rss_start_bytes"],
                soak["rss_end_bytes"],
                soak["rss_growth_percent"],
                strict=True,
            ),
            start=1,
        ):
            print(
                f"  instance {i} RSS {report.megabytes(start)} -> {report.megabytes(end)} "
                f"({report.number(growth, 1)} %)"
            )
        peak = soak["backends_peak"]
        print(
            f"  PostgreSQL backends on the database during the soak: peak {sum(peak.values())} ("
            + ", ".join(f"{name} {n}" for name, n in peak.items())
            + f"); idle before {sum(soak['backends_before'].values())}, "
            f"after {sum(soak['backends_after'].values())}"
        )
    if document["auth"]:
        print("\n".join(report.auth_lines(document["auth"])))
    o = document["settings"]["options"]
    background = document["settings"]["background"]
    if o["settle_seconds"] > 0 and background:
        commits_note = (
            "pg_stat_database.xact_commit before and after each row's first round, each read "
            f"after waiting {o['settle_seconds']:g} s for PostgreSQL to flush its statistics, less "
            f"what the idle instances' background loops commit ({background['commits_per_s']:.1f}"
            " /s, measured first) over that window"
        )
    else:
        commits_note = (
            "not read (--smoke or --settle-seconds 0: each read needs ~10 s for PostgreSQL to "
            "flush its statistics)"
        )
    calls_note = (
        "top-level pg_stat_statements calls per job, counted like commits"
        if pgss is None
        else f"unavailable ({pgss})"
    )
    xids_background = f" (idle instances: {background['xids_per_s']:.2f} /s)" if background else ""
    commits_note += "; the lean table's and the peers' are not read (other databases)"
    print(
        "\nnotes:\n"
        f"  - jobs/s: median over {o['rounds']} round(s); the targets' runs interleave within each "
        "round, tables truncated before each run; drains time only the drain (pre-load untimed, "
        "500 jobs a call: jobq's through its own batch enqueue, the raw baselines' through their "
        "500-row statement on the orchestrator's connection, each peer's through its own batch "
        "enqueue in the load process).\n"
        "  - schema: raw SQL, asyncpg, one connection per client, one autocommit statement per "
        "step, on jobq's own tables: the schema's triggers, counters and indexes fire for it too, "
        "so it pays them as jobq does. lean: the same statements, text for text, on the lean "
        "queue table in its own database on the same server (bench/lean.py: the columns they "
        "touch, a primary key, one partial claim index, no triggers). The rows with concurrency "
        f"keys run on jobq's schema only ({report.NOT_RUN}); there the raw statements take no "
        "keys either. The jobq servers stay up (their background loops run) during the raw "
        "runs.\n"
        "  - server CPU ms/req: utime+stime of the jobq serve processes (/proc) over the timed "
        "section, per HTTP request. client CPU: the load process's CPU over the timed section, as "
        f"a share of wall time x {document['settings']['cores']} cores.\n"
        f"  - commits/job: {commits_note}.\n"
        "  - xids/job: transaction ids assigned per job (pg_current_snapshot() before and after "
        "every run: exact and immediate, server-wide; only transactions that write or NOTIFY "
        f"take one){xids_background}.\n"
        f"  - calls/job: {calls_note}.\n"
        "  - with and without keys: one client, one request at a time, claim (max_jobs 1) then "
        "complete of a pre-loaded job, each timed on its own; medians over the rounds of each "
        "run's p50 and p99. All rounds without keys run first (authentication never turns off in "
        "a running instance), then an admin key is made and waited for (401 without it on every "
        "instance); server CPU per request is over both routes."
    )
    if peers:
        print(
            f"  - PGQueuer {peers['pgqueuer']['version']}: in the load process (no HTTP, no "
            "service), one asyncpg connection (AsyncpgDriver) per client, its own database on the "
            "same server, its tables truncated before each run, interleaved with the other runs. "
            "Enqueue: Queries.enqueue, one job per call or lists of 500. Drain: one QueueManager "
            "per worker in drain mode, batch_size = max_jobs, PGQueuer's defaults otherwise: it "
            "dequeues again without waiting for the batch's handlers (no max_concurrent_tasks) "
            "and acknowledges in a buffer (finished jobs moved to its log in one statement per "
            "batch_size jobs or 0.1 s), flushed before the timed section ends. The jobq servers "
            "stay up during its runs. The rows with concurrency keys run as plain drains. Its "
            "client CPU, xids and statements per job are in --json.\n"
            f"  - Procrastinate {peers['procrastinate']['version']}: in the load process, one App "
            "whose PsycopgConnector pool holds a connection per client or worker (its defaults "
            "otherwise: a transaction per statement, the pool checking a connection before "
            "handing it out), its own database on the same server, its tables truncated before "
            "each run. Enqueue: the task's defer_async, one job per call, or batch_defer_async "
            "with 500. Drain: one worker per simulated worker (concurrency 1, wait=False, no "
            "LISTEN), each fetching one job per statement and marking it succeeded in another; "
            "each worker's start (prune, register) and stop (unregister), three statements, are "
            "timed. It has no claim of several jobs at once and no concurrency keys: the rows "
            f"with max_jobs 50 and those with keys are not run ({report.NOT_RUN}). Its client "
            "CPU, xids and statements per job are in --json."
        )
    failures = document["verification"]["failures"]
    if failures:
        print(f"\nVERIFICATION FAILED: {len(failures)} check(s)")
        for line in failures:
            print(f"  - {line}")
    else:
        print(
            "\nverification: passed (each enqueue's rows match the requests; each drain completed "
            "every pre-loaded job exactly once, none left pending or running)"
        )
    print(f"finished in {document['duration_seconds']:.0f} s")


async def run(url: str, server: str, args: argparse.Namespace, started: float) -> int:
    """Starts the instances, runs the suite, prints and writes the figures; answers the exit code."""
    options = options_from(args)
    dsn = raw_dsn(url)
    admin = await asyncpg.connect(dsn, server_settings={"application_name": "bench-orchestrator"})
    servers: list[JobqProcess] = []
    try:
        async with contextlib.AsyncExitStack() as stack:
            siblings: list[Sibling] = []
            if "rows" in options.sections:
                siblings.append(await stack.enter_async_context(lean.lean(dsn)))
            if options.peers and "rows" in options.sections:
                from bench import peers, procrastinate_peer  # import the peers' packages

                siblings.append(await stack.enter_async_context(peers.peer(dsn)))
                siblings.append(await stack.enter_async_context(procrastinate_peer.peer(dsn)))
            for _ in range(args.instances):
                servers.append(await stack.enter_async_context(jobq_process(url)))
            suite = Suite(dsn=dsn, servers=servers, admin=admin, options=options, siblings=siblings)
            await suite.check_pg_stat_statements()
            chosen = options.sections
            if "rows" in chosen:  # only the table's rows read commits
                await suite.measure_background()
            settings = {
                "server": server,
                "database": await admin.fetchval("SELECT current_database()"),
                "postgresql": await pg_settings(admin),
                "cores": cores(),
                "python": platform.python_version(),
                "json": "orjson" if has_orjson() else "stdlib json",
                "instances": args.instances,
                "pools": pools(url),
                "pg_stat_statements": suite.pg_stat_statements,
                "lean": suite.siblings["lean"].describe() if "lean" in suite.siblings else None,
                "peers": {
                    name: sibling.describe()
                    for name, sibling in suite.siblings.items()
                    if name in PEERS
                }
                or None,
                "background": suite.background,
                "options": asdict(options),
            }
            print_settings(settings)
            rows = []
            for row in ROWS if "rows" in chosen else ():
                if args.rows and row.key not in args.rows:
                    continue
                print(f"{row.label}:", flush=True)
                rows.append(await suite.run_row(row))
            composed = []
            for spec, units in zip(
                composed_suite.COMPOSED_ROWS, (options.chains, options.fanins), strict=True
            ):
                if spec.workload in chosen and units > 0:
                    print(f"{spec.label} ({units:,} {spec.unit} per run):", flush=True)
                    composed.append(await composed_suite.run_row(suite, spec, units))
            if {"latency", "history", "soak"} & set(chosen):
                print("enqueue->claim latency, claim latency on a long history, soak:", flush=True)
            latency = await suite.latency() if "latency" in chosen else {}
            history = await suite.history() if "history" in chosen else {}
            soak = await suite.soak() if "soak" in chosen else {}
            auth: dict[str, Any] = {}
            if "auth" in chosen:
                # Last: once it has made a key, every instance wants it until it stops.
                print("claim and complete latency without and with API keys:", flush=True)
                auth = await suite.auth()
            document = {
                "settings": settings,
                "rows": rows,
                "composed": composed,
                "latency": latency,
                "history": history,
                "soak": soak,
                "auth": auth,
                "verification": {"passed": not suite.failures, "failures": suite.failures},
                "duration_seconds": time.monotonic() - started,
            }
            print_results(document)
            if args.json:
                report.write_json(args.json, document)
                print(f"figures written to {args.json}")
            if suite.failures:
                for i, served in enumerate(servers, start=1):
                    print(f"\n--- jobq serve instance {i} output (kept in {served.log_path}) ---")
                    print(served.log_tail())
            return 1 if suite.failures else 0
    finally:
        await admin.close()


def has_orjson() -> bool:
    """Whether the load process's JSON goes through orjson."""
    try:
        import orjson  # noqa: F401
    except ImportError:
        return False
    return True


def main(argv: list[str] | None = None) -> int:
    """Entry point: parses the command line, makes the database, runs."""
    args = parser().parse_args(argv)
    if args.instances < 1:
        raise SystemExit("--instances must be at least 1")
    if args.peers:
        peer_versions()
    started = time.monotonic()
    if args.dsn:
        server = "--dsn server"
    elif os.environ.get("DATABASE_URL"):
        server = "DATABASE_URL server"
    else:
        server = "embedded"
    with database(args.dsn) as url:
        return asyncio.run(run(url, server, args, started))


if __name__ == "__main__":
    sys.exit(main())
