"""The orchestrator behind ``python -m bench``: runs every workload, verifies it, gathers the figures.

It never generates load itself: each run is a ``python -m bench.load`` subprocess (HTTP against
the `jobq serve` instances, or raw SQL through asyncpg), whose JSON answer carries the timed
figures. Around each run this module truncates the tables, pre-loads jobs when the workload
drains, reads counters before and after (transaction ids assigned, every run; and, in each row's
first round once the statistics have settled, ``pg_stat_database.xact_commit`` and
``pg_stat_statements`` when available), and checks the database against what the load process
says it did. Every failed check is kept in :attr:`Suite.failures`, printed as it is found, and
makes the command fail.

Rows (interleaved per round, medians over ``--rounds``): single enqueue with 1 and 16 clients,
batches of 500 with 4 clients, and drains with 1, 4 and 16 workers claiming 1 and 50 at a time,
each against jobq, raw SQL on jobq's schema and the same raw SQL on the lean queue table
(``bench/lean.py``, its own database on the same server; not the rows with concurrency keys).
With ``--peers`` each round also runs the row through PGQueuer (``bench/peers.py``) and
Procrastinate (``bench/procrastinate_peer.py``, rows claiming one job at a time) in the load
process, each on its own database on the same server. The lean table and the peers are
:class:`Sibling` targets, run and checked one way (:meth:`Suite.run_sibling_once`). Then:
enqueue-to-claim latency with idle long-pollers, claim latency on an empty history and after a
long one, and a soak with each instance's RSS and PostgreSQL's backends. Last, claim and complete
latency of one client without API keys and then with one (:meth:`Suite.auth`): authentication
turns on once a key exists and never off, so every load from then on sends the key.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal, Protocol

import asyncpg
import httpx

from bench import baseline, checks
from bench.baseline import APPLICATION_NAME as RAW_APPLICATION_NAME
from bench.harness import ROOT, JobqProcess, percentile
from bench.procstat import tree_rss_bytes

QUEUE = "bench"
PRELOAD_BATCH = 500
PRELOAD_CLIENTS = 4
LATENCY_POLLERS = 4
LATENCY_INTERVAL_SECONDS = 0.02  # one job every 20 ms: 50 jobs/s, a modest rate
CLAIM_BACKLOG = 100
SOAK_PRODUCERS = 4
SOAK_WORKERS = 4
HISTORY_TARGET_RATIO = 1.2
AUTH_KEY_NAME = "bench-admin"
AUTH_PROBE_PATH = "/v1/queues"  # needs a key once authentication is on, changes nothing
# Instances reload their keys on the key table's notification, within milliseconds; the periodic
# reload (JOBQ_AUTH_REFRESH_SECONDS, 10 s by default) would catch a lost one well within this.
AUTH_ON_TIMEOUT_SECONDS = 30.0
AUTH_POLL_SECONDS = 0.01
# Probes in a row, each on a new connection, that must find authentication on: with
# JOBQ_WORKERS > 1 an instance is several processes sharing its port, each with its own keys.
AUTH_CONFIRMATIONS = 5
LOAD_TIMEOUT_SECONDS = 300.0
# A PostgreSQL 15+ backend flushes its statistics at most once a second, and an idle one with
# counts pending waits 10 s (PGSTAT_IDLE_INTERVAL) before flushing them: pg_stat_database shows a
# jobq run's commits in full only that long after the run's last statement.
STATS_SETTLE_SECONDS = 10.5
# How long the idle instances are watched to learn their background loops' commit rate.
BACKGROUND_SECONDS = 10.0

Target = Literal["jobq", "raw"]  # on the jobq database; the others are Sibling targets
# Figures kept per run and summarised (medians) per row, by target.
SUMMARY_KEYS = (
    "jobs_per_s",
    "server_cpu_ms_per_request",
    "client_cpu_share",
    "xids_per_job",
    "commits_per_job",
    "calls_per_job",
)
SIBLING_SUMMARY_KEYS = ("jobs_per_s", "client_cpu_share", "xids_per_job", "statements_per_job")


@dataclass(frozen=True)
class Options:
    """What to run: sizes, repetitions and how long statistics take to settle."""

    jobs: int
    rounds: int
    soak_seconds: float
    history_rows: int
    latency_jobs: int
    claim_samples: int
    auth_jobs: int  # claim + complete pairs per run, without and with API keys
    settle_seconds: float  # 0: do not read xact_commit / pg_stat_statements
    smoke: bool
    peers: bool = False  # also run the rows through PGQueuer and Procrastinate
    chains: int = 0  # workflows a -> b -> c per run of the chain row (bench/composed_suite.py)
    fanins: int = 0  # batches of 100 with a callback per run of the fan-in row
    sections: tuple[str, ...] = ()  # what to run (SECTIONS in bench/__main__.py); empty: all
    batch_answer: str = "ids"  # what jobq's batch enqueues ask for (?answer=)


@dataclass(frozen=True)
class Row:
    """One line of the table: a workload run against jobq and against raw SQL."""

    key: str
    label: str
    kind: Literal["enqueue", "drain"]
    clients: int
    batch: int = 1
    max_jobs: int = 1
    # > 0: the jobs carry this many concurrency keys under a limit that never binds, so the row
    # shows what keys cost a claim (the lock, count and release of each key's flow_state row).
    keys: int = 0


ROWS = (
    Row("enqueue_single_1", "enqueue single, 1 client", "enqueue", 1),
    Row("enqueue_single_16", "enqueue single, 16 clients", "enqueue", 16),
    Row("enqueue_batch500_4", "enqueue batch 500, 4 clients", "enqueue", 4, batch=500),
    Row("drain_1_max1", "drain, 1 worker, max_jobs 1", "drain", 1),
    Row("drain_4_max1", "drain, 4 workers, max_jobs 1", "drain", 4),
    Row("drain_16_max1", "drain, 16 workers, max_jobs 1", "drain", 16),
    Row("drain_1_max50", "drain, 1 worker, max_jobs 50", "drain", 1, max_jobs=50),
    Row("drain_4_max50", "drain, 4 workers, max_jobs 50", "drain", 4, max_jobs=50),
    Row("drain_16_max50", "drain, 16 workers, max_jobs 50", "drain", 16, max_jobs=50),
    Row(
        "drain_16_max1_keys",
        "drain, 16 workers, max_jobs 1, 20 concurrency keys",
        "drain",
        16,
        keys=20,
    ),
    Row(
        "drain_16_max50_keys",
        "drain, 16 workers, max_jobs 50, 20 concurrency keys",
        "drain",
        16,
        max_jobs=50,
        keys=20,
    ),
)

# The limit the keyed rows run under: every key of theirs, a max_running no run reaches.
KEY_LIMIT = (
    "INSERT INTO flow_limits (scope, pattern, like_pattern, max_running) "
    "VALUES ('key', 'bench-key:*', 'bench-key:%', 1000000)"
)

HISTORY_INSERT = """
INSERT INTO jobs (queue, type, payload, priority, status, attempts, max_attempts, lease_seconds,
                  run_at, worker_id, lease_ended_by, created_at, started_at, finished_at,
                  updated_at)
SELECT $1, 'bench', jsonb_build_object('n', g), 0, 'succeeded', 1, 10, 30,
       t.at, 'bench-history', 'complete', t.at, t.at, t.at, t.at
FROM generate_series(1, $2::int) AS g
CROSS JOIN LATERAL (SELECT now() - make_interval(secs => g % 86400) AS at) AS t
"""

BACKENDS = """
SELECT coalesce(nullif(application_name, ''), '(none)') AS name, count(*) AS n
FROM pg_stat_activity
WHERE datname = current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend'
GROUP BY 1 ORDER BY 1
"""


class LoadFailed(Exception):
    """The load process exited with an error."""


class Sibling(Protocol):
    """A target on a database of its own on the same server: the lean table, each peer.

    The load process runs its ``<workload>-enqueue`` and ``<workload>-drain`` workloads against
    :attr:`dsn`; the orchestrator empties its tables and checks them after each run.
    """

    name: str  # the key of its figures in each row, and of its ratio: ratio_<name>
    workload: str  # the load process's workload prefix ("raw": bench/baseline.py's)
    dsn: str
    admin: Any  # the orchestrator's asyncpg connection to its database

    def runs(self, *, max_jobs: int, keys: int) -> bool:
        """Whether it runs a row claiming ``max_jobs`` at a time (with ``keys`` keys)."""
        ...

    def describe(self) -> dict[str, str]:
        """What the settings block and the JSON say about it."""
        ...

    async def truncate(self) -> None:
        """Empties its tables."""
        ...

    async def queued_ids(self) -> set[int]:
        """The ids of the jobs it holds."""
        ...

    async def check_enqueue(self, result: dict[str, Any], n: int) -> list[str]:
        """The failed checks of an enqueue of ``n`` jobs."""
        ...

    async def check_drain(self, result: dict[str, Any], preloaded: set[int]) -> list[str]:
        """The failed checks of a drain of ``preloaded``."""
        ...


def cores() -> int:
    """CPUs this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def median(values: Sequence[float | None]) -> float | None:
    """Median of the known values, None when there are none."""
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def latency_figures(samples: Sequence[float]) -> dict[str, Any]:
    """p50, p99 and count of latency samples in ms."""
    if not samples:
        return {"n": 0, "p50_ms": None, "p99_ms": None}
    values = list(samples)
    return {"n": len(values), "p50_ms": percentile(values, 50), "p99_ms": percentile(values, 99)}


class Suite:
    """Runs the workloads against ``servers`` on the database ``dsn``; collects figures and failures."""

    def __init__(
        self,
        *,
        dsn: str,
        servers: Sequence[JobqProcess],
        admin: Any,
        options: Options,
        siblings: Sequence[Sibling] = (),
    ) -> None:
        self.dsn = dsn
        # The lean table's database, then each peer's (with --peers), by name.
        self.siblings = {sibling.name: sibling for sibling in siblings}
        self.servers = list(servers)
        self.admin = admin  # one asyncpg connection for setup, checks and statistics
        self.options = options
        self.failures: list[str] = []
        self.pg_stat_statements: str | None = None  # None: available; else why not
        self.last_jobq_activity = time.monotonic()
        self.background: dict[str, Any] = {}
        # Set once the auth pair made a key: from then on every HTTP load sends it.
        self.api_key: str | None = None

    @property
    def bases(self) -> list[str]:
        """The instances' base URLs."""
        return [server.base for server in self.servers]

    @property
    def server_pids(self) -> list[int]:
        """The instances' process ids."""
        return [server.pid for server in self.servers]

    # -- plumbing ------------------------------------------------------------------------------

    def fail(self, context: str, message: str) -> None:
        """Records and prints a failed check."""
        line = f"{context}: {message}"
        self.failures.append(line)
        print(f"  VERIFICATION FAILED [{line}]", flush=True)
        for server in self.servers:
            server.keep_log = True

    async def load(self, workload: str, args: dict[str, Any]) -> dict[str, Any]:
        """Runs ``python -m bench.load workload args`` and answers its JSON.

        HTTP workloads (those given ``bases``) get the API key, once one exists, as ``api_key``.
        """
        if self.api_key is not None and "bases" in args:
            args = {**args, "api_key": self.api_key}
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "bench.load",
            workload,
            json.dumps(args),
            cwd=ROOT,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        # Generous: the slowest run (1 worker, max_jobs 1) does 2 requests per job; a hang ends here.
        limit = LOAD_TIMEOUT_SECONDS + self.options.jobs / 10 + self.options.soak_seconds
        try:
            out, err = await asyncio.wait_for(process.communicate(), limit)
        except TimeoutError:
            process.kill()
            await process.wait()
            raise LoadFailed(
                f"python -m bench.load {workload} still running after {limit:.0f} s; killed"
            ) from None
        if process.returncode != 0:
            raise LoadFailed(
                f"python -m bench.load {workload} exited {process.returncode}: "
                + err.decode(errors="replace")[-2000:]
            )
        result: dict[str, Any] = json.loads(out)
        if "bases" in args:
            self.last_jobq_activity = time.monotonic()
        return result

    async def truncate(self) -> None:
        """Empties the queue tables (a trigger clears the counters)."""
        await self.admin.execute("TRUNCATE jobs, queues, flow_limits, flow_state, flow_released")

    async def check_pg_stat_statements(self) -> None:
        """Makes ``pg_stat_statements`` usable here, or records why it is not."""
        created = False
        try:
            existed = await self.admin.fetchval(
                "SELECT count(*) FROM pg_extension WHERE extname = 'pg_stat_statements'"
            )
            await self.admin.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            created = not existed
            await self.admin.fetchval("SELECT count(*) FROM pg_stat_statements")
            self.pg_stat_statements = None
        except asyncpg.PostgresError as exc:
            self.pg_stat_statements = str(exc).splitlines()[0]
            if created:
                await self.admin.execute("DROP EXTENSION IF EXISTS pg_stat_statements")

    async def statement_counts(self) -> dict[str, Any]:
        """Counters read before and after a run: transaction ids assigned so far (instant, exact,
        server-wide) and, with ``settle``, this database's commits and statement calls."""
        counts: dict[str, Any] = {
            "at": time.monotonic(),
            "xids": await self.admin.fetchval(
                "SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint"
            ),
        }
        counts["commits"] = await self.admin.fetchval(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
        )
        counts["calls"] = None
        if self.pg_stat_statements is None:
            counts["calls"] = await self.admin.fetchval(
                "SELECT coalesce(sum(calls), 0)::bigint FROM pg_stat_statements "
                "WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) "
                "AND query NOT LIKE '%pg\\_stat\\_%'"
            )
        return counts

    async def settle(self) -> None:
        """Waits until this database's statistics hold every finished run's statements.

        The raw load's backends flush theirs as they exit; jobq's pooled backends stay open, so
        their counts show only ``settle_seconds`` after their last statement.
        """
        for _ in range(500):  # at most 10 s: an exiting backend is gone in milliseconds
            gone = not await self.admin.fetchval(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE datname = current_database() AND application_name = $1",
                RAW_APPLICATION_NAME,
            )
            if gone:
                break
            await asyncio.sleep(0.02)
        wait = self.last_jobq_activity + self.options.settle_seconds - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)

    async def measure_background(self) -> None:
        """Learns the commits and calls per second of the idle instances' background loops.

        The promoter, the elections and the other loops commit on their own, also while a run's
        statistics settle; :meth:`statement_deltas` subtracts this rate over each window.
        """
        if self.options.settle_seconds <= 0:
            return
        await self.settle()
        first = await self.statement_counts()
        await asyncio.sleep(BACKGROUND_SECONDS)
        second = await self.statement_counts()
        elapsed = second["at"] - first["at"]
        self.background = {
            "commits_per_s": (second["commits"] - first["commits"]) / elapsed,
            "calls_per_s": (
                (second["calls"] - first["calls"]) / elapsed if first["calls"] is not None else None
            ),
            "xids_per_s": (second["xids"] - first["xids"]) / elapsed,
        }

    def statement_deltas(
        self, before: dict[str, Any], after: dict[str, Any], jobs: int, *, settled: bool
    ) -> dict[str, float | None]:
        """Per job: transaction ids, and (when settled) commits and calls less the background's."""
        deltas: dict[str, float | None] = {"xids_per_job": (after["xids"] - before["xids"]) / jobs}
        if settled:
            window = after["at"] - before["at"]
            commits = after["commits"] - before["commits"]
            deltas["commits_per_job"] = (commits - window * self.background["commits_per_s"]) / jobs
            if before["calls"] is not None and self.background["calls_per_s"] is not None:
                calls = after["calls"] - before["calls"]
                deltas["calls_per_job"] = (calls - window * self.background["calls_per_s"]) / jobs
        return deltas

    # -- table rows ----------------------------------------------------------------------------

    def settles(self, round_index: int) -> bool:
        """Whether this run reads commits and calls (each read waits for a settle)."""
        return self.options.settle_seconds > 0 and round_index == 0

    def targets(self, row: Row) -> list[str]:
        """What ``row`` runs against, in order within a round: jobq, raw SQL on its schema, then
        each sibling that runs such a row (the lean table, then the peers)."""
        return [
            "jobq",
            "raw",
            *(
                name
                for name, sibling in self.siblings.items()
                if sibling.runs(max_jobs=row.max_jobs, keys=row.keys)
            ),
        ]

    async def run_row(self, row: Row) -> dict[str, Any]:
        """Runs ``row`` on every target, interleaved, ``rounds`` times; answers the medians.

        A sibling that does not run the row has ``None`` for its figures and its ratio.
        """
        targets = self.targets(row)
        rounds: dict[str, list[dict[str, Any]]] = {target: [] for target in targets}
        for round_index in range(self.options.rounds):
            for target in targets:
                context = f"{row.label}, {target}, round {round_index + 1}"
                try:
                    if target in self.siblings:
                        figures = await self.run_sibling_once(row, self.siblings[target], context)
                    else:
                        figures = await self.run_once(
                            row,
                            "jobq" if target == "jobq" else "raw",
                            context,
                            settled=self.settles(round_index),
                        )
                except LoadFailed as exc:
                    self.fail(context, str(exc))
                    continue
                rounds[target].append(figures)
                print(
                    f"  {context:<52} {figures['jobs_per_s']:>10,.0f} jobs/s"
                    f"  ({figures['wall_seconds']:.2f} s)",
                    flush=True,
                )
        summary: dict[str, Any] = asdict(row)
        for target in ("jobq", "raw", *self.siblings):
            if target not in rounds:
                summary[target] = None
                continue
            runs = rounds[target]
            keys = SUMMARY_KEYS if target in ("jobq", "raw") else SIBLING_SUMMARY_KEYS
            summary[target] = {key: median([run.get(key) for run in runs]) for key in keys}
            summary[target]["rounds"] = runs
        jobq, raw = jobs_per_s(summary, "jobq"), jobs_per_s(summary, "raw")
        summary["ratio"] = quotient(jobq, raw)  # jobq ÷ raw SQL on jobq's schema
        for name in self.siblings:  # jobq ÷ the lean table, ÷ each peer
            summary[f"ratio_{name}"] = quotient(jobq, jobs_per_s(summary, name))
        if "lean" in self.siblings:  # what jobq's schema costs the same statements
            summary["ratio_raw_lean"] = quotient(raw, jobs_per_s(summary, "lean"))
        return summary

    async def run_sibling_once(self, row: Row, sibling: Sibling, context: str) -> dict[str, Any]:
        """One run of ``row`` on a sibling's own database, verified; answers its figures.

        Drains pre-load (untimed) 500 jobs a statement: the raw statement on the orchestrator's
        own connection for the lean table (as for raw SQL on jobq's schema), a peer's own batch
        enqueue through the load process. Commits and statement calls are not read: they are
        counted per database and the jobq database's figures are the ones settled for;
        transaction ids are server-wide and read as for the others.
        """
        n = self.options.jobs
        await sibling.truncate()
        preloaded: set[int] = set()
        if row.kind == "drain":
            if sibling.workload == "raw":
                result = await baseline.insert_batches(
                    sibling.admin, queue=QUEUE, jobs=n, batch=PRELOAD_BATCH
                )
            else:
                result = await self.load(
                    f"{sibling.workload}-enqueue",
                    {
                        "dsn": sibling.dsn,
                        "queue": QUEUE,
                        "clients": PRELOAD_CLIENTS,
                        "jobs": n,
                        "batch": PRELOAD_BATCH,
                    },
                )
            self.check_errors(result, f"{context}, pre-load")
            for failure in await sibling.check_enqueue(result, n):
                self.fail(f"{context}, pre-load", failure)
            preloaded = await sibling.queued_ids()
        before = await self.statement_counts()
        args: dict[str, Any] = {"dsn": sibling.dsn, "queue": QUEUE}
        if row.kind == "enqueue":
            args |= {"clients": row.clients, "jobs": n, "batch": row.batch}
        else:
            args |= {"workers": row.clients, "max_jobs": row.max_jobs}
        result = await self.load(f"{sibling.workload}-{row.kind}", args)
        after = await self.statement_counts()

        self.check_errors(result, context)
        if row.kind == "enqueue":
            failures = await sibling.check_enqueue(result, n)
        else:
            failures = await sibling.check_drain(result, preloaded)
        for failure in failures:
            self.fail(context, failure)

        wall, jobs = result["wall_seconds"], result["jobs"]
        figures: dict[str, Any] = {
            "jobs": jobs,
            "statements": result["statements"],
            "statements_per_job": result["statements"] / jobs if jobs else None,
            "wall_seconds": wall,
            "jobs_per_s": jobs / wall if wall > 0 else None,
            "client_cpu_seconds": result["client_cpu_seconds"],
            "client_cpu_share": result["client_cpu_seconds"] / (wall * cores()) if wall else None,
            "error_count": result["error_count"],
        }
        if jobs:
            figures |= self.statement_deltas(before, after, jobs, settled=False)
        return figures

    async def run_once(
        self, row: Row, target: Target, context: str, *, settled: bool
    ) -> dict[str, Any]:
        """One run of ``row`` against ``target``, verified; answers its figures."""
        n = self.options.jobs
        await self.truncate()
        if row.keys and target == "jobq":
            await self.admin.execute(KEY_LIMIT)
        if row.kind == "drain":
            await self.preload(target, n, context, keys=row.keys)
        if settled:
            await self.settle()
        before = await self.statement_counts()
        args: dict[str, Any] = {"queue": QUEUE}
        if target == "jobq":
            args |= {"bases": self.bases, "server_pids": self.server_pids}
        else:
            args |= {"dsn": self.dsn}
        if row.kind == "enqueue":
            args |= {"clients": row.clients, "jobs": n, "batch": row.batch}
            if target == "jobq":
                args["answer"] = self.options.batch_answer
        else:
            args |= {"workers": row.clients, "max_jobs": row.max_jobs, "wait_seconds": 0}
        workload = row.kind if target == "jobq" else f"raw-{row.kind}"
        result = await self.load(workload, args)
        if settled:
            await self.settle()
        after = await self.statement_counts()

        if row.kind == "enqueue":
            await self.verify_enqueue(result, n, context)
        else:
            await self.verify_drain(result, n, context)

        wall, jobs = result["wall_seconds"], result["jobs"]
        figures: dict[str, Any] = {
            "jobs": jobs,
            "requests": result["requests"],
            "wall_seconds": wall,
            "jobs_per_s": jobs / wall if wall > 0 else None,
            "client_cpu_seconds": result["client_cpu_seconds"],
            "client_cpu_share": result["client_cpu_seconds"] / (wall * cores()) if wall else None,
            "server_cpu_seconds": result["server_cpu_seconds"] if target == "jobq" else None,
            "server_cpu_ms_per_request": (
                1000 * result["server_cpu_seconds"] / result["requests"]
                if target == "jobq" and result["requests"]
                else None
            ),
            "error_count": result["error_count"],
        }
        if jobs:
            figures |= self.statement_deltas(before, after, jobs, settled=settled)
        return figures

    async def preload(self, target: Target, n: int, context: str, *, keys: int = 0) -> None:
        """Enqueues ``n`` jobs (untimed) in batches of 500: jobq's through its own batch enqueue
        from the load process (over ``keys`` concurrency keys when > 0), raw SQL's through the
        same 500-row statement on the orchestrator's connection."""
        if target == "jobq":
            args: dict[str, Any] = {
                "queue": QUEUE,
                "clients": PRELOAD_CLIENTS,
                "jobs": n,
                "batch": PRELOAD_BATCH,
                "keys": keys,
            }
            result = await self.load("enqueue", args | {"bases": self.bases})
        else:
            result = await baseline.insert_batches(
                self.admin, queue=QUEUE, jobs=n, batch=PRELOAD_BATCH
            )
        await self.verify_enqueue(result, n, f"{context}, pre-load")

    # -- checks --------------------------------------------------------------------------------

    def check_errors(self, result: dict[str, Any], context: str) -> None:
        """Fails when the load process saw errors (HTTP status, broken connection, SQL error)."""
        if result["error_count"]:
            shown = "; ".join(result["errors"][:5])
            self.fail(context, f"{result['error_count']} errors in the load process: {shown}")

    async def verify_enqueue(self, result: dict[str, Any], n: int, context: str) -> None:
        """Every job was sent and answered once, and the table holds exactly those rows."""
        self.check_errors(result, context)
        for failure in await checks.enqueue(self.admin, result, n):
            self.fail(context, failure)

    async def verify_drain(self, result: dict[str, Any], n: int, context: str) -> None:
        """Every pre-loaded job completed exactly once by the load and succeeded in the table."""
        self.check_errors(result, context)
        for failure in await checks.drain(self.admin, result, n):
            self.fail(context, failure)

    # -- the other workloads -------------------------------------------------------------------

    async def latency(self) -> dict[str, Any]:
        """Enqueue response to claim response, with idle long-polling workers."""
        await self.truncate()
        context = "enqueue->claim latency"
        args = {
            "queue": "latency",
            "bases": self.bases,
            "jobs": self.options.latency_jobs,
            "interval_seconds": LATENCY_INTERVAL_SECONDS,
            "pollers": LATENCY_POLLERS,
        }
        try:
            result = await self.load("latency", args)
        except LoadFailed as exc:
            self.fail(context, str(exc))
            return {}
        self.check_errors(result, context)
        samples = result["latencies_ms"]
        if len(samples) != self.options.latency_jobs:
            self.fail(context, f"{len(samples)} of {self.options.latency_jobs} jobs timed")
        return {
            **latency_figures(samples),
            "pollers": LATENCY_POLLERS,
            "wait_seconds": 20,
            "rate_per_s": 1 / LATENCY_INTERVAL_SECONDS,
        }

    async def history(self) -> dict[str, Any]:
        """Claim latency on a small backlog, before and after a long history of finished jobs."""
        await self.truncate()
        figures: dict[str, Any] = {
            "backlog": CLAIM_BACKLOG,
            "history_rows": self.options.history_rows,
        }
        args = {"queue": "history", "bases": self.bases, "samples": self.options.claim_samples}
        try:
            empty = await self.load("claim-latency", args | {"preload": CLAIM_BACKLOG})
            self.check_errors(empty, "claim latency, empty history")
            started = time.perf_counter()
            await self.admin.execute(HISTORY_INSERT, "history", self.options.history_rows)
            await self.admin.execute("ANALYZE jobs")
            figures["insert_seconds"] = time.perf_counter() - started
            long = await self.load("claim-latency", args | {"preload": 0})
            self.check_errors(long, "claim latency, long history")
        except LoadFailed as exc:
            self.fail("claim latency", str(exc))
            return figures
        figures["empty"] = latency_figures(empty["latencies_ms"])
        figures["long"] = latency_figures(long["latencies_ms"])
        for p in ("p50_ms", "p99_ms"):
            a, b = figures["empty"][p], figures["long"][p]
            figures[f"ratio_{p[:3]}"] = b / a if a and b else None
        finished = await self.admin.fetchval("SELECT count(*) FROM jobs WHERE status = 'succeeded'")
        if finished < self.options.history_rows:
            self.fail(
                "claim latency", f"{finished} finished rows, {self.options.history_rows} seeded"
            )
        return figures

    async def backends(self) -> dict[str, int]:
        """Client backends connected to this database, by application name (not this one)."""
        return {row["name"]: row["n"] for row in await self.admin.fetch(BACKENDS)}

    async def soak(self) -> dict[str, Any]:
        """Mixed load for ``soak_seconds``: RSS of each instance and PostgreSQL backends in use."""
        await self.truncate()
        context = "soak"
        rss_start = [tree_rss_bytes(pid) for pid in self.server_pids]
        backends_start = await self.backends()
        peak: dict[str, int] = {}
        args = {
            "queue": "soak",
            "bases": self.bases,
            "server_pids": self.server_pids,
            "seconds": self.options.soak_seconds,
            "producers": SOAK_PRODUCERS,
            "workers": SOAK_WORKERS,
            "max_jobs": 10,
        }
        task = asyncio.create_task(self.load("soak", args))
        while not task.done():
            await asyncio.wait({task}, timeout=1.0)
            if not task.done():
                now = await self.backends()
                if sum(now.values()) > sum(peak.values()):
                    peak = now
        try:
            result = task.result()
        except LoadFailed as exc:
            self.fail(context, str(exc))
            return {}
        rss_end = [tree_rss_bytes(pid) for pid in self.server_pids]
        self.check_errors(result, context)
        enqueued, completed = result["enqueued_ids"], result["completed_ids"]
        stored = {row["id"] for row in await self.admin.fetch("SELECT id FROM jobs")}
        unfinished = await self.admin.fetchval(
            "SELECT count(*) FROM jobs WHERE status <> 'succeeded'"
        )
        if len(set(completed)) != len(completed):
            self.fail(context, f"{len(completed) - len(set(completed))} jobs completed twice")
        if set(completed) != set(enqueued) or stored != set(enqueued):
            self.fail(
                context,
                f"{len(enqueued)} enqueued, {len(set(completed))} completed, {len(stored)} rows",
            )
        if unfinished:
            self.fail(context, f"{unfinished} jobs not succeeded after the soak")
        wall = result["wall_seconds"]
        return {
            "seconds": self.options.soak_seconds,
            "producers": SOAK_PRODUCERS,
            "workers": SOAK_WORKERS,
            "enqueued": len(enqueued),
            "completed": len(completed),
            "jobs_per_s": len(completed) / wall if wall else None,
            "server_cpu_ms_per_request": (
                1000 * result["server_cpu_seconds"] / result["requests"]
                if result["requests"]
                else None
            ),
            "rss_start_bytes": rss_start,
            "rss_end_bytes": rss_end,
            "rss_growth_percent": [
                100 * (end - start) / start if start else None
                for start, end in zip(rss_start, rss_end, strict=True)
            ],
            "backends_before": backends_start,
            "backends_peak": peak,
            "backends_after": await self.backends(),
        }

    # -- with and without API keys -------------------------------------------------------------

    async def auth(self) -> dict[str, Any]:
        """Claim and complete latency of one client, every round without API keys, then with one.

        The runs cannot alternate: a running instance turns authentication on once any key
        exists and never off again, so the rounds without keys all run first (on instances warm
        from the soak), then an admin key is made in the bench database and, once every instance
        refuses a request without it (401) and accepts one with it, the rounds run again sending
        it. Every load after this sends the key (:meth:`load`). Call it last.
        """
        rounds, jobs = self.options.rounds, self.options.auth_jobs
        figures: dict[str, Any] = {
            "jobs": jobs,
            "rounds": rounds,
            "order": "every round without keys first: authentication never turns off again",
        }
        # No keep-alive: every probe opens a new connection (see AUTH_CONFIRMATIONS).
        limits = httpx.Limits(max_keepalive_connections=0)
        async with httpx.AsyncClient(timeout=10, limits=limits) as client:
            off = {base: await self.auth_state(client, base) for base in self.bases}
            if any(state != (200, None) for state in off.values()):
                self.fail("auth", f"authentication is not off before any key exists: {off}")
            without = [
                await self.lease_latency(f"claim+complete without keys, round {i + 1}")
                for i in range(rounds)
            ]
            figures["without_keys"] = lease_summary(without)
            figures |= await self.turn_auth_on(client)
        if self.api_key is None:
            return figures
        with_keys = [
            await self.lease_latency(f"claim+complete with keys, round {i + 1}")
            for i in range(rounds)
        ]
        figures["with_keys"] = lease_summary(with_keys)
        figures["delta_ms"] = {
            f"{what}_{p}": difference(
                figures["with_keys"][what][f"{p}_ms"], figures["without_keys"][what][f"{p}_ms"]
            )
            for what in ("claim", "complete")
            for p in ("p50", "p99")
        } | {
            "server_cpu_per_request": difference(
                figures["with_keys"]["server_cpu_ms_per_request"],
                figures["without_keys"]["server_cpu_ms_per_request"],
            )
        }
        return figures

    async def auth_state(self, client: httpx.AsyncClient, base: str) -> tuple[int, int | None]:
        """The status of ``GET /v1/queues`` on one instance without a key, and with the key if any."""
        without = (await client.get(base + AUTH_PROBE_PATH)).status_code
        if self.api_key is None:
            return without, None
        headers = {"Authorization": f"Bearer {self.api_key}"}
        return without, (await client.get(base + AUTH_PROBE_PATH, headers=headers)).status_code

    async def turn_auth_on(self, client: httpx.AsyncClient) -> dict[str, Any]:
        """Makes an admin key (``app.auth.store``, which notifies the instances) and waits, with a
        deadline, until every instance answers 401 without it and 200 with it, ``AUTH_CONFIRMATIONS``
        times in a row.

        Answers the seconds from the key's commit until each instance first did so for good, and
        every other (without, with) status pair an instance answered on the way there. On
        time-out the failure is recorded and ``api_key`` is left unset, so no later load sends it.
        """
        from sqlalchemy.ext.asyncio import create_async_engine
        from sqlalchemy.pool import NullPool

        from app.auth import store
        from app.auth.keys import Role
        from app.db import async_url

        engine = create_async_engine(async_url(self.dsn), poolclass=NullPool)
        try:
            async with engine.begin() as conn:
                secret = await store.create_key(
                    conn, name=AUTH_KEY_NAME, role=Role.ADMIN, queues=None
                )
        finally:
            await engine.dispose()
        committed = time.monotonic()
        self.api_key = secret
        on_after: dict[str, float] = {}
        # Per instance: when the current run of (401, 200) probes began, and its length.
        streak: dict[str, tuple[float, int]] = {}
        seen: dict[str, list[str]] = {base: [] for base in self.bases}
        deadline = committed + AUTH_ON_TIMEOUT_SECONDS
        while len(on_after) < len(self.bases):
            for base in self.bases:
                if base in on_after:
                    continue
                without, with_key = await self.auth_state(client, base)
                at = time.monotonic() - committed  # when the answers were in: an upper bound
                if (without, with_key) == (401, 200):
                    first, length = streak.get(base, (at, 0))
                    streak[base] = (first, length + 1)
                    if length + 1 >= AUTH_CONFIRMATIONS:
                        on_after[base] = first
                    continue
                if base in streak:
                    seen[base].append(f"{without} without the key after a 401")
                    del streak[base]
                elif (without, with_key) != (200, 200):  # 200/200: not reloaded yet
                    seen[base].append(f"{without} without the key, {with_key} with it")
            if len(on_after) == len(self.bases):
                break
            if time.monotonic() > deadline:
                self.api_key = None
                self.fail(
                    "auth",
                    f"{len(self.bases) - len(on_after)} instance(s) still accept requests "
                    f"without a key {AUTH_ON_TIMEOUT_SECONDS:g} s after one was made",
                )
                break
            await asyncio.sleep(AUTH_POLL_SECONDS)
        for base, states in seen.items():
            for state in dict.fromkeys(states):
                print(f"  note: {base} answered {state} while authentication turned on")
        return {
            "auth_on_seconds": [on_after.get(base) for base in self.bases],
            "auth_other_states": {base: sorted(set(states)) for base, states in seen.items()},
        }

    async def lease_latency(self, context: str) -> dict[str, Any]:
        """One run of the ``lease-latency`` workload on pre-loaded jobs, verified."""
        n, failed_before = self.options.auth_jobs, len(self.failures)
        figures: dict[str, Any] = {"keys": self.api_key is not None}
        try:
            await self.truncate()
            await self.preload("jobq", n, f"{context}, pre-load")
            args = {"queue": QUEUE, "bases": self.bases, "server_pids": self.server_pids, "jobs": n}
            result = await self.load("lease-latency", args)
        except LoadFailed as exc:
            self.fail(context, str(exc))
            result = None
        if result is not None:
            await self.verify_drain(result, n, context)
            figures |= {
                "jobs": result["jobs"],
                "requests": result["requests"],
                "wall_seconds": result["wall_seconds"],
                "claim": latency_figures(result["claim_latencies_ms"]),
                "complete": latency_figures(result["complete_latencies_ms"]),
                "server_cpu_ms_per_request": (
                    1000 * result["server_cpu_seconds"] / result["requests"]
                    if result["requests"]
                    else None
                ),
            }
            claim, complete = figures["claim"]["p50_ms"], figures["complete"]["p50_ms"]
            if claim is not None and complete is not None:
                print(
                    f"  {context:<52} claim p50 {claim:.2f} ms, complete p50 {complete:.2f} ms",
                    flush=True,
                )
        figures["failures"] = self.failures[failed_before:]
        return figures


def lease_summary(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Medians over the rounds of ``lease-latency`` runs, the runs, and their failed checks."""
    summary: dict[str, Any] = {
        what: {
            "n": sum(run.get(what, {}).get("n", 0) for run in runs),
            "p50_ms": median([run.get(what, {}).get("p50_ms") for run in runs]),
            "p99_ms": median([run.get(what, {}).get("p99_ms") for run in runs]),
        }
        for what in ("claim", "complete")
    }
    summary["server_cpu_ms_per_request"] = median(
        [run.get("server_cpu_ms_per_request") for run in runs]
    )
    summary["failures"] = [line for run in runs for line in run["failures"]]
    summary["rounds"] = list(runs)
    return summary


def jobs_per_s(summary: dict[str, Any], target: str) -> float | None:
    """The median jobs/s of ``target`` in a row's summary, None when it did not run."""
    figures = summary.get(target)
    return figures["jobs_per_s"] if figures else None


def quotient(value: float | None, reference: float | None) -> float | None:
    """``value ÷ reference``, None when either is unknown or zero."""
    return value / reference if value and reference else None


def difference(value: float | None, reference: float | None) -> float | None:
    """``value - reference``, None when either is unknown."""
    return value - reference if value is not None and reference is not None else None
