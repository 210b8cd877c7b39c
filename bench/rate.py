"""``python -m bench.rate``: latency under sustained load, jobq against a lean queue and PGQueuer.

    python -m bench.rate                                   # embedded PostgreSQL, 60 s per rate
    python -m bench.rate --dsn postgresql://postgres@127.0.0.1:5432/postgres --seconds 20
    python -m bench.rate --rates 200,500,1000 --workers 8 --systems jobq,lean --json rate.json

Producers offer R jobs/s for ``--seconds`` on a schedule fixed in advance (open loop: a slow
system builds a backlog instead of slowing the producer, and a producer that falls behind its
schedule is reported), while W workers (``--workers``, default 8 and 32) each take a job, work
1 ms (``asyncio.sleep(0.001)``) and complete it. Three systems run in the same invocation, each on
its own database on one PostgreSQL server (``bench/rate_systems.py``): jobq over HTTP (a real
`jobq serve`, long-polling workers), the lean raw-SQL queue (``FOR UPDATE SKIP LOCKED``,
LISTEN/NOTIFY) and PGQueuer 1.6 in process. Each run is a separate load process
(``python -m bench.rate_load``) and reports the offered and completed rates, pickup latency (the
enqueue's send to the start of work) p50/p95/p99/max and the queue depth sampled every second.

For each system and W the rates of ``--rates`` are tried in ascending order until one is not
sustained (pickup p99 over 50 ms, or fewer than 97 % of the rate's jobs done within the window);
runs interleave by rate, so drift hits every system alike. The table shows the highest rate
each sustained with its p50/p95/p99. Every run is verified against the database (each enqueued
job done exactly once); a failed check is printed and the command exits 1. Speed is reported,
never asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

import asyncpg

from bench import rate_report
from bench.harness import ROOT, database, raw_dsn
from bench.rate_load import LATE_MS, SYSTEMS
from bench.rate_systems import System, open_systems

DEFAULT_RATES = (100, 200, 500, 1000, 2000, 5000, 10_000)
DEFAULT_WORKERS = (8, 32)
TARGET_P99_MS = 50.0
MIN_COMPLETION = 0.97
DEPTH_EVERY_SECONDS = 1.0
COMMIT_PROBES = 30
# For a load process to start (it waits up to 60 s for connection slots) and to stop.
START_SECONDS = 120.0
PG_SETTINGS = ("server_version", "synchronous_commit", "fsync", "shared_buffers", "max_connections")
HIDDEN = ("system", "enqueued_ids", "completed_ids")  # the load's answer, not kept per run


class LoadFailed(Exception):
    """The load process exited with an error or did not finish in time."""

    def __init__(self, message: str, output: str = "") -> None:
        super().__init__(message)
        self.output = output[-4000:]  # the end of its standard error, for the JSON


def positive_ints(text: str) -> tuple[int, ...]:
    """A comma-separated list of positive integers, ascending, each once."""
    try:
        values = {int(part) for part in text.split(",") if part.strip()}
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of integers: {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"name one or more positive integers: {text!r}")
    return tuple(sorted(values))


def system_names(text: str) -> tuple[str, ...]:
    """``--systems``: known names, in the order given."""
    named = [name.strip() for name in text.split(",") if name.strip()]
    if unknown := set(named) - set(SYSTEMS):
        raise argparse.ArgumentTypeError(
            f"unknown system(s) {', '.join(sorted(unknown))}; choose from {', '.join(SYSTEMS)}"
        )
    if not named:
        raise argparse.ArgumentTypeError("name at least one system")
    return tuple(dict.fromkeys(named))


def parser() -> argparse.ArgumentParser:
    """The command line."""
    p = argparse.ArgumentParser(
        prog="python -m bench.rate", description=__doc__.split("\n")[0] if __doc__ else None
    )
    p.add_argument("--dsn", help="PostgreSQL server to use (fresh databases are made on it)")
    p.add_argument("--seconds", type=float, default=60.0, help="schedule length per run (60)")
    p.add_argument(
        "--rates",
        type=positive_ints,
        default=DEFAULT_RATES,
        help=f"jobs/s to try, ascending (default {','.join(map(str, DEFAULT_RATES))})",
    )
    p.add_argument(
        "--workers", type=positive_ints, default=DEFAULT_WORKERS, help="worker counts (8,32)"
    )
    p.add_argument(
        "--systems",
        type=system_names,
        default=SYSTEMS,
        help=f"systems to run (default {','.join(SYSTEMS)})",
    )
    p.add_argument("--json", type=Path, help="also write every figure to this JSON file")
    return p


def pgqueuer_version() -> str:
    """PGQueuer's version, or exits saying how to install it."""
    try:
        import pgqueuer  # noqa: F401
    except ImportError as exc:
        raise SystemExit(
            f"the pgqueuer system needs PGQueuer, which is not importable here ({exc}); install "
            "it with: pip install -e '.[bench]' (or leave it out: --systems jobq,lean)"
        ) from None
    return importlib.metadata.version("pgqueuer")


def drain_timeout(seconds: float) -> float:
    """The longest a run may take to finish its backlog after the schedule ends (while jobs keep
    getting done: a drain that stalls for 30 s ends there): ten times the schedule, and a minute,
    enough for a first rate far above what the system does."""
    return 60.0 + 10 * seconds


async def load(system: System, args: dict[str, Any]) -> tuple[dict[str, Any], list[int]]:
    """Runs ``python -m bench.rate_load``, sampling queue depth every second from its start.

    Answers the load's figures and the depth series.
    """
    limit = float(args["seconds"]) + float(args["drain_timeout_seconds"]) + START_SECONDS
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bench.rate_load",
        system.name,
        json.dumps(args),
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert process.stdout is not None and process.stderr is not None
    stdout, stderr = process.stdout, process.stderr
    errors = asyncio.create_task(stderr.read())
    rest: asyncio.Task[bytes] | None = None
    depth: list[int] = []
    try:
        async with asyncio.timeout(limit):
            if await stdout.readline():  # the "started" line: the schedule begins
                rest = asyncio.create_task(stdout.read())
                next_at = time.monotonic()
                while not rest.done():
                    depth.append(await system.depth())
                    next_at += DEPTH_EVERY_SECONDS
                    await asyncio.wait({rest}, timeout=max(0.0, next_at - time.monotonic()))
                out = rest.result()
            else:
                out = b""
            await process.wait()
            err = await errors
    except TimeoutError:
        process.kill()
        await process.wait()
        raise LoadFailed(f"python -m bench.rate_load still running after {limit:.0f} s") from None
    finally:
        for task in (errors, rest):
            if task is not None and not task.done():
                task.cancel()
    if process.returncode != 0 or not out.strip():
        text = err.decode(errors="replace").strip()
        last = text.splitlines()[-1] if text else "no output"
        raise LoadFailed(f"python -m bench.rate_load exited {process.returncode}: {last}", text)
    result: dict[str, Any] = json.loads(out.splitlines()[-1])
    return result, depth


def judge(run: dict[str, Any]) -> tuple[bool, str]:
    """Whether the run sustained its rate, and why not."""
    if run["failures"]:
        return False, "verification failed"
    p99 = run["pickup_ms"]["p99"]
    if p99 is None or p99 > TARGET_P99_MS:
        return False, f"pickup p99 {rate_report.number(p99, 1)} ms"
    if run["completed_per_s"] < MIN_COMPLETION * run["rate"]:
        return False, f"done {rate_report.number(run['completed_per_s'])}/s"
    return True, ""


async def measure(system: System, rate: int, workers: int, seconds: float) -> dict[str, Any]:
    """One run of ``system`` at ``rate`` jobs/s with ``workers`` workers, verified and judged."""
    await system.truncate()
    run: dict[str, Any] = {
        "system": system.name,
        "workers": workers,
        "rate": rate,
        "seconds": seconds,
    }
    args = {
        **system.load_args(),
        "rate": rate,
        "seconds": seconds,
        "workers": workers,
        "drain_timeout_seconds": drain_timeout(seconds),
        "server_pids": system.server_pids,
    }
    try:
        result, depth = await load(system, args)
    except LoadFailed as exc:
        failed = {"failures": [str(exc)], "load_stderr": exc.output}
        return {**run, **failed, "sustained": False, "why": "load failed"}
    run.update({key: value for key, value in result.items() if key not in HIDDEN})
    run["failures"] = await system.verify(result)
    run["depth"] = rate_report.depth_figures(depth)
    wall = result["wall_seconds"]
    run["load_cpu_share"] = result["client_cpu_seconds"] / wall if wall else 0.0
    lag_p99 = result["send_lag_ms"]["p99"]
    run["producer_behind"] = lag_p99 is not None and lag_p99 > LATE_MS
    run["sustained"], run["why"] = judge(run)
    return run


def summarise(
    runs: list[dict[str, Any]], systems: tuple[str, ...], workers: tuple[int, ...]
) -> list[dict[str, Any]]:
    """Per system and W: the highest sustained run and the first that was not."""
    rows = []
    for name in systems:
        for w in workers:
            mine = sorted(
                (r for r in runs if r["system"] == name and r["workers"] == w),
                key=lambda r: r["rate"],
            )
            sustained = [r for r in mine if r["sustained"]]
            failed = [r for r in mine if not r["sustained"]]
            rows.append(
                {
                    "system": name,
                    "workers": w,
                    "best": sustained[-1] if sustained else None,
                    "first_failed": failed[0] if failed else None,
                }
            )
    return rows


async def pg_settings(url: str) -> dict[str, Any]:
    """The PostgreSQL settings worth printing next to the figures, the database's name, and what
    one commit costs here: ``COMMIT_PROBES`` one-row autocommit INSERTs in a row, each timed."""
    conn = await asyncpg.connect(raw_dsn(url))
    try:
        shown: dict[str, Any] = {name: await conn.fetchval(f"SHOW {name}") for name in PG_SETTINGS}
        shown["database"] = await conn.fetchval("SELECT current_database()")
        await conn.execute("CREATE TABLE bench_rate_commit_probe (n integer)")
        samples = []
        for n in range(COMMIT_PROBES):
            begun = time.perf_counter()
            await conn.execute("INSERT INTO bench_rate_commit_probe VALUES ($1)", n)
            samples.append((time.perf_counter() - begun) * 1000)
        await conn.execute("DROP TABLE bench_rate_commit_probe")
        samples.sort()
        shown["commit_ms"] = {"p50": samples[len(samples) // 2], "max": samples[-1]}
        return shown
    finally:
        await conn.close()


def jobq_settings(url: str) -> str:
    """The settings `jobq serve` runs with here (its environment's)."""
    from app.settings import Settings

    settings = Settings(database_url=url)
    return (
        f"server processes {settings.workers}, db_pool_size {settings.db_pool_size}, "
        f"db_read_pool_size {settings.db_read_pool_size}"
    )


async def run(url: str, server: str, args: argparse.Namespace, started: float) -> int:
    """Brings the systems up, climbs the rate ladders, prints and writes the figures."""
    names: tuple[str, ...] = args.systems
    async with open_systems(url, names) as systems:
        pg = await pg_settings(url)
        settings = {
            "server": server,
            "database": pg.pop("database"),
            "postgresql": pg,
            "commit_probes": COMMIT_PROBES,
            "cores": len(os.sched_getaffinity(0)),
            "python": platform.python_version(),
            "jobq": jobq_settings(url) if "jobq" in names else None,
            "pgqueuer": pgqueuer_version() if "pgqueuer" in names else None,
            "options": {
                "seconds": args.seconds,
                "rates": list(args.rates),
                "workers": list(args.workers),
                "systems": list(names),
                "target_p99_ms": TARGET_P99_MS,
                "min_completion": MIN_COMPLETION,
            },
        }
        print("\n".join(rate_report.settings_lines(settings)), flush=True)
        climbing = {(name, w) for name in names for w in args.workers}
        runs: list[dict[str, Any]] = []
        failures: list[str] = []
        for rate in args.rates:
            for w in args.workers:
                for name in names:
                    if (name, w) not in climbing:
                        continue
                    one = await measure(systems[name], rate, w, args.seconds)
                    runs.append(one)
                    print(rate_report.run_line(one), flush=True)
                    if one["failures"]:
                        failures.extend(f"{name} W {w} {rate}/s: {f}" for f in one["failures"])
                        if extra := systems[name].diagnostics():
                            print(extra, flush=True)
                    if not one["sustained"]:
                        climbing.discard((name, w))
        summary = summarise(runs, names, args.workers)
        print()
        print(rate_report.table(summary, TARGET_P99_MS, MIN_COMPLETION))
        print()
        print(rate_report.NOTES)
        if failures:
            print(f"\nVERIFICATION FAILED: {len(failures)} check(s)")
            for line in failures:
                print(f"  - {line}")
        else:
            print(f"\nverification: passed ({len(runs)} runs, each enqueued job done exactly once)")
        print(f"finished in {time.monotonic() - started:.0f} s")
        if args.json:
            document = rate_report.document(
                settings, runs, summary, failures, time.monotonic() - started
            )
            rate_report.write_json(args.json, document)
            print(f"figures written to {args.json}")
        return 1 if failures else 0


def main(argv: list[str] | None = None) -> int:
    """Entry point: parses the command line, makes the database, runs."""
    args = parser().parse_args(argv)
    if args.seconds <= 0:
        raise SystemExit("--seconds must be positive")
    if "pgqueuer" in args.systems:
        pgqueuer_version()
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
