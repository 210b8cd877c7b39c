"""``python -m bench.workers``: the Python, TypeScript and Go Workers against bare HTTP loops, same server, same run.

    python -m bench.workers                       # embedded PostgreSQL, 3 rounds
    python -m bench.workers --smoke               # a short run (300 jobs, one round)
    python -m bench.workers --dsn postgresql://postgres@127.0.0.1:5432/postgres --json w.json
    python -m bench.workers --before-commit 3f55118   # every client before and after, one sitting

One real `jobq serve` (``bench/harness.py``) serves every run. For each concurrency N of
``--concurrency`` (1, 16, 128) and each handler (``noop``, ``sleep1ms``: ``asyncio.sleep(0.001)``)
a queue is pre-loaded with ``--jobs`` jobs and drained by a separate load process
(``python -m bench.workers_load``): by a bare loop (N tasks of claim one, run, complete) over
one shared ``httpx.AsyncClient`` ("bare") or over the bench's lean asyncio-streams client, a
connection per task ("lean": what a hand-written aiohttp loop moves), by
``Worker(concurrency=N)``, or by the TypeScript and Go clients' Workers (``--clients``; each run
by its contract driver, built by the bench: npm and go). Runs interleave over ``--rounds`` rounds (odd rounds run the modes in
reverse order), so drift on a shared machine hits all alike; the table shows medians: jobs/s,
Worker ÷ each bare loop, and CPU ms per job of the load process
(its own ``time.process_time``) and of the server (``/proc``, ``bench/procstat.py``).

Every run is verified in the database: each pre-loaded job succeeded, was claimed once
(``attempts`` 1) and its handler ran once. A failed check is printed and the command exits 1.
``--before DIR`` also runs, interleaved with the others, the Worker of another ``jobq_client`` (an
earlier commit's: ``git archive <commit> jobq_client | tar -x -C DIR``): before and after in one
sitting.
``--before-commit REV`` does the same for all three clients: ``jobq_client`` and ``clients/`` of
that commit (``git archive``), the TypeScript and Go ones built with this checkout's drivers.
``--profile DIR`` writes each run's cProfile stats there (``python -m pstats``).
Speed is reported, never asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import asyncpg
import httpx

from bench.checks import handled
from bench.harness import ROOT, database, jobq_process, raw_dsn
from bench.workers_load import DRIVEN_MODES, HANDLERS, MODES, WORKER_MODES

CONCURRENCIES = (1, 16, 128)
JOBS = 1000  # the backlog of issue 41's measurement
SMOKE_JOBS = 300
BATCH = 1000  # jobs per POST /v1/jobs/batch when pre-loading
LOAD_LIMIT_SECONDS = 600.0

STATE = """
SELECT count(*) AS total,
       count(*) FILTER (WHERE status <> 'succeeded') AS unfinished,
       count(*) FILTER (WHERE attempts <> 1) AS reclaimed
FROM jobs WHERE queue = $1
"""


def parser() -> argparse.ArgumentParser:
    """The command line."""
    p = argparse.ArgumentParser(
        prog="python -m bench.workers", description=__doc__.split("\n")[0] if __doc__ else None
    )
    p.add_argument("--dsn", help="PostgreSQL server to use (a fresh database is made on it)")
    p.add_argument(
        "--jobs", type=int, help=f"pre-loaded jobs per run ({JOBS}; {SMOKE_JOBS} with --smoke)"
    )
    p.add_argument("--rounds", type=int, default=3, help="rounds; medians are shown (3)")
    p.add_argument(
        "--concurrency",
        default=",".join(map(str, CONCURRENCIES)),
        help="comma-separated concurrencies (1,16,128)",
    )
    p.add_argument("--smoke", action="store_true", help="a short run: fewer jobs, one round")
    p.add_argument("--json", type=Path, help="also write every figure to this JSON file")
    p.add_argument(
        "--before",
        type=Path,
        help="also run the Worker of the jobq_client in this folder (e.g. `git archive` of a commit)",
    )
    p.add_argument(
        "--claim-ahead",
        type=int,
        default=0,
        help="the Worker's claim_ahead (0); the --before Worker runs without",
    )
    p.add_argument("--profile", type=Path, help="write each run's cProfile stats here (a folder)")
    p.add_argument(
        "--before-commit",
        help="also run the Workers of this commit's three clients (git archive; each driven by "
        "this checkout's driver): before and after in one sitting; sets --before",
    )
    p.add_argument(
        "--clients",
        default="python,typescript,go",
        help="whose Workers run (python,typescript,go); the other two through their contract "
        "drivers, built first (npm, go)",
    )
    return p


def drivers(clients: list[str], out_dir: Path, before: Path | None = None) -> dict[str, list[str]]:
    """The argv of each other client's contract driver, built now (and of the earlier clients in
    ``before``, as ``<client>-before``); a client that cannot be built here is left out, saying
    why."""
    # The contract suite's own build steps (tests/contract/drivers.py), which report a failure
    # the pytest way: as pytest's outcome exceptions.
    import pytest

    from tests.contract.drivers import build_driver

    wanted = [(client, client, ROOT / "clients") for client in clients if client != "python"]
    if before is not None:
        wanted += [(f"{c}-before", c, before / "clients") for c in clients if c != "python"]
    built: dict[str, list[str]] = {}
    for mode, client, folder in wanted:
        binaries = out_dir / mode
        binaries.mkdir(parents=True, exist_ok=True)
        try:
            built[mode] = build_driver(client, binaries, folder)
        except (pytest.fail.Exception, pytest.skip.Exception) as exc:
            print(f"{mode}: its driver could not be built, left out: {exc}", flush=True)
    return built


# This checkout's drivers, copied into an earlier commit's clients so that both run the same
# handlers (noop, sleep1ms) through each client's public API.
DRIVER_SOURCES = (
    "clients/typescript/src/contract/driver.ts",
    "clients/go/cmd/jobq-contract-driver/main.go",
)


def earlier_clients(commit: str, into: Path) -> Path:
    """``jobq_client`` and ``clients/`` as ``commit`` had them, with this checkout's drivers."""
    into.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "archive", commit, "jobq_client", "clients"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    for source in DRIVER_SOURCES:
        shutil.copyfile(ROOT / source, into / source)
    return into


async def preload(base: str, queue: str, jobs: int, type_: str) -> list[int]:
    """Enqueues ``jobs`` jobs of type ``type_`` (the handler's name) on ``queue``; their ids."""
    ids: list[int] = []
    async with httpx.AsyncClient(base_url=base, timeout=60.0) as http:
        for first in range(0, jobs, BATCH):
            items = [
                {"queue": queue, "type": type_, "payload": {"n": n}}
                for n in range(first, min(jobs, first + BATCH))
            ]
            answer = await http.post("/v1/jobs/batch?answer=ids", json={"jobs": items})
            answer.raise_for_status()
            ids.extend(answer.json()["ids"])
    return ids


async def load(args: dict[str, Any]) -> dict[str, Any]:
    """Runs one ``python -m bench.workers_load``; answers its JSON."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bench.workers_load",
        json.dumps(args),
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        async with asyncio.timeout(LOAD_LIMIT_SECONDS):
            out, err = await process.communicate()
    except TimeoutError:
        process.kill()
        await process.wait()
        raise RuntimeError(f"load still running after {LOAD_LIMIT_SECONDS:g} s") from None
    if process.returncode != 0 or not out.strip():
        raise RuntimeError(
            f"load exited {process.returncode}: {err.decode(errors='replace')[-2000:]}"
        )
    result: dict[str, Any] = json.loads(out.splitlines()[-1])
    return result


async def verify(
    admin: asyncpg.Connection, queue: str, ids: list[int], result: dict[str, Any]
) -> list[str]:
    """Each pre-loaded job ran once, was claimed once and succeeded; the load saw no errors."""
    failures = handled(result["handled_ids"], set(ids), "run")
    state = await admin.fetchrow(STATE, queue)
    if state["total"] != len(ids):
        failures.append(f"{state['total']} rows in queue {queue}, {len(ids)} pre-loaded")
    if state["unfinished"]:
        failures.append(f"{state['unfinished']} jobs not succeeded after the drain")
    if state["reclaimed"]:
        failures.append(f"{state['reclaimed']} jobs claimed more than once (attempts <> 1)")
    failures.extend(f"load error: {text}" for text in result["errors"])
    return failures


def median(runs: list[dict[str, Any]], key: str) -> float:
    return statistics.median(run[key] for run in runs)


def cells(of: dict[str, list[dict[str, Any]]], key: str, form: str) -> str:
    """One figure's medians, a column per mode."""
    return "".join(f"{median(runs, key):9{form}}" for runs in of.values())


LABELS = {
    "bare": "httpx",
    "lean": "lean",
    "worker": "py",
    "before": "py-0",
    "typescript": "ts",
    "typescript-before": "ts-0",
    "go": "go",
    "go-before": "go-0",
}


def table(runs: list[dict[str, Any]], concurrencies: list[int]) -> str:
    """Medians per concurrency and handler: jobs/s, each Worker ÷ each bare loop, client and
    server CPU per job."""
    modes = [mode for mode in MODES if any(r["mode"] == mode for r in runs)]
    workers = [mode for mode in WORKER_MODES if mode in modes]
    # Against the lean loop only: the stand-in for a hand-written aiohttp loop, the bound
    # (the httpx loop pays httpx's own cost per request; its jobs/s are in the first columns).
    bares = [mode for mode in ("lean",) if mode in modes] or [m for m in ("bare",) if m in modes]
    width = 9 * len(modes)
    heads = "".join(f"{LABELS[mode]:>9}" for mode in modes)
    ratio_heads = "".join(f"{LABELS[w]:>7}" for w in workers for b in bares)
    lines = [
        "(py: jobq_client's Worker, ts: TypeScript's, go: Go's; -0: --before's; httpx and lean:",
        " the bare loops)",
        f"{'':15}{'jobs/s':^{width}}  {'÷ ' + LABELS[bares[0]]:^{len(ratio_heads)}}"
        f"  {'client CPU ms/job':^{width}}  {'server CPU ms/job':^{width}}",
        f"  N  handler    {heads}  {ratio_heads}  {heads}  {heads}",
    ]
    for n in concurrencies:
        for handler in HANDLERS:
            of = {
                mode: [
                    r
                    for r in runs
                    if r["concurrency"] == n and r["handler"] == handler and r["mode"] == mode
                ]
                for mode in modes
            }
            if not all(of.values()):
                continue
            ratios = "".join(
                f"{median(of[w], 'jobs_per_s') / median(of[b], 'jobs_per_s'):7.2f}"
                for w in workers
                for b in bares
            )
            lines.append(
                f"{n:3d}  {handler:<9} {cells(of, 'jobs_per_s', '.0f')}  {ratios}  "
                f"{cells(of, 'client_cpu_ms_per_job', '.3f')}  "
                f"{cells(of, 'server_cpu_ms_per_job', '.3f')}"
            )
    return "\n".join(lines)


async def run(url: str, args: argparse.Namespace, concurrencies: list[int]) -> int:
    """Starts the server, runs every round, prints and writes the figures."""
    jobs = args.jobs or (SMOKE_JOBS if args.smoke else JOBS)
    rounds = 1 if args.smoke else args.rounds
    runs: list[dict[str, Any]] = []
    failures: list[str] = []
    if args.profile:
        args.profile.mkdir(parents=True, exist_ok=True)
    clients = [part.strip() for part in args.clients.split(",") if part.strip()]
    before_clients = None
    if args.before_commit:
        before_clients = earlier_clients(args.before_commit, args.scratch / "before")
        args.before = before_clients
    built = drivers(clients, args.scratch / "drivers", before_clients)
    admin = await asyncpg.connect(raw_dsn(url))
    try:
        async with jobq_process(url) as served:
            print(
                f"jobq serve pid {served.pid}; {jobs} jobs a run, {rounds} round(s), "
                f"{len(os.sched_getaffinity(0))} cores",
                flush=True,
            )
            number = 0
            for round_ in range(rounds):
                for n in concurrencies:
                    for handler in HANDLERS:
                        modes = tuple(
                            m
                            for m in MODES
                            if (m != "before" or args.before)
                            and (m not in ("worker", "before") or "python" in clients)
                            and (m not in DRIVEN_MODES or m in built)
                        )
                        modes = modes if round_ % 2 == 0 else tuple(reversed(modes))
                        for mode in modes:
                            number += 1
                            queue = f"bw{number}"
                            ids = await preload(served.base, queue, jobs, handler)
                            load_args: dict[str, Any] = {
                                "base": served.base,
                                "queue": queue,
                                "mode": mode,
                                "concurrency": n,
                                "handler": handler,
                                "jobs": jobs,
                                "server_pids": [served.pid],
                            }
                            if mode == "worker" and args.claim_ahead:
                                load_args["claim_ahead"] = args.claim_ahead
                            if mode == "before":
                                load_args["client"] = str(args.before.resolve())
                            if mode in DRIVEN_MODES:
                                load_args["driver"] = built[mode]
                                load_args["dsn"] = raw_dsn(url)
                            if args.profile:
                                load_args["profile"] = str(
                                    args.profile / f"{mode}-{n}-{handler}-{round_}.prof"
                                )
                            result = await load(load_args)
                            problems = await verify(admin, queue, ids, result)
                            wall = result["wall_seconds"]
                            one = {
                                "round": round_,
                                "concurrency": n,
                                "handler": handler,
                                "mode": mode,
                                "jobs": jobs,
                                "wall_seconds": wall,
                                "jobs_per_s": jobs / wall if wall else 0.0,
                                "client_cpu_ms_per_job": result["client_cpu_seconds"] * 1000 / jobs,
                                "server_cpu_ms_per_job": result["server_cpu_seconds"] * 1000 / jobs,
                                "failures": problems,
                            }
                            runs.append(one)
                            failures.extend(
                                f"{queue} ({mode}, N {n}, {handler}): {p}" for p in problems
                            )
                            print(
                                f"round {round_ + 1} N {n:3d} {handler:<8} {mode:<10} "
                                f"{one['jobs_per_s']:7.0f} jobs/s  client "
                                f"{one['client_cpu_ms_per_job']:.3f} ms/job  server "
                                f"{one['server_cpu_ms_per_job']:.3f} ms/job"
                                + ("  FAILED" if problems else ""),
                                flush=True,
                            )
                            await admin.execute("DELETE FROM jobs WHERE queue = $1", queue)
    finally:
        await admin.close()
    print()
    print(table(runs, concurrencies))
    if failures:
        print(f"\nVERIFICATION FAILED: {len(failures)} check(s)")
        for line in failures[:50]:
            print(f"  - {line}")
    else:
        print(f"\nverification: passed ({len(runs)} runs, each pre-loaded job ran exactly once)")
    if args.json:
        args.json.write_text(json.dumps({"runs": runs, "failures": failures}, indent=2) + "\n")
        print(f"figures written to {args.json}")
    return 1 if failures else 0


def main(argv: list[str] | None = None) -> int:
    """Entry point: parses the command line, makes the database, runs."""
    args = parser().parse_args(argv)
    try:
        concurrencies = [int(part) for part in args.concurrency.split(",") if part.strip()]
    except ValueError:
        raise SystemExit(f"--concurrency: not a list of integers: {args.concurrency!r}") from None
    if not concurrencies or min(concurrencies) < 1 or (args.jobs or 1) < 1 or args.rounds < 1:
        raise SystemExit("--concurrency, --jobs and --rounds must be positive")
    unknown = {part.strip() for part in args.clients.split(",")} - {"python", *DRIVEN_MODES}
    if unknown:
        raise SystemExit(f"--clients: unknown {sorted(unknown)}; python, typescript, go")
    started = time.monotonic()
    with database(args.dsn) as url, tempfile.TemporaryDirectory(prefix="bench-drivers-") as tmp:
        args.scratch = Path(tmp)
        code = asyncio.run(run(url, args, concurrencies))
    print(f"finished in {time.monotonic() - started:.0f} s")
    return code


if __name__ == "__main__":
    sys.exit(main())
