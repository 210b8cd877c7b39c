"""The composed-work rows of ``python -m bench`` (issue 21): a 3-step chain and a 100-way fan-in.

Each row runs ``bench/composed.py`` against jobq and ``bench/composed_raw.py`` on raw SQL,
interleaved per round on the same database (tables truncated before each run), and reports
units (workflows, batches) and jobs per second and the end-to-end latency of a unit, p50 and
p95, medians over the rounds. Every run is verified against the database: every unit ended
once, every job succeeded on its first attempt, one workflow per chain, one callback per batch.

Both sides run closed loops of the same shape: ``in_flight`` producers each send a unit and
wait for it to end before sending the next, while ``workers`` workers claim up to ``max_jobs``
and complete them. A unit's latency thus includes its queueing behind the other units in flight.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

from bench.harness import percentile
from bench.report import grid, number, pair, percent
from bench.suite import QUEUE, LoadFailed, Suite, cores, median

FAN = 100


@dataclass(frozen=True)
class ComposedRow:
    """One composed workload: its shape, and how many units are in flight at once."""

    key: str
    label: str
    workload: Literal["chain", "fanin"]
    unit: str  # what one unit is called in the output
    jobs_per_unit: int
    in_flight: int
    workers: int
    max_jobs: int
    fan: int = 0


COMPOSED_ROWS = (
    ComposedRow("chain3", "3-step chain a->b->c", "chain", "workflows", 3, 16, 4, 10),
    ComposedRow(
        "fanin100", f"{FAN}-way fan-in, callback", "fanin", "batches", FAN + 1, 4, 4, 50, fan=FAN
    ),
)
SUMMARY_KEYS = (
    "units_per_s",
    "jobs_per_s",
    "p50_ms",
    "p95_ms",
    "p99_ms",
    "server_cpu_ms_per_request",
    "client_cpu_share",
    "xids_per_job",
)


def latency_figures(samples: Sequence[float]) -> dict[str, Any]:
    """p50, p95, p99 and count of latency samples in ms."""
    if not samples:
        return {"n": 0, "p50_ms": None, "p95_ms": None, "p99_ms": None}
    values = list(samples)
    return {
        "n": len(values),
        "p50_ms": percentile(values, 50),
        "p95_ms": percentile(values, 95),
        "p99_ms": percentile(values, 99),
    }


async def run_row(suite: Suite, row: ComposedRow, units: int) -> dict[str, Any]:
    """Runs ``row`` with ``units`` units on jobq and on raw SQL, interleaved, ``rounds`` times;
    answers the medians and every run's figures."""
    rounds: dict[str, list[dict[str, Any]]] = {"jobq": [], "raw": []}
    for round_index in range(suite.options.rounds):
        for target in ("jobq", "raw"):
            context = f"{row.label}, {target}, round {round_index + 1}"
            try:
                figures = await run_once(suite, row, target, units, context)
            except LoadFailed as exc:
                suite.fail(context, str(exc))
                continue
            rounds[target].append(figures)
            print(
                f"  {context:<52} {figures['units_per_s']:>8,.1f} {row.unit}/s"
                f"  p50 {figures['p50_ms'] or 0:,.1f} ms  p95 {figures['p95_ms'] or 0:,.1f} ms"
                f"  ({figures['wall_seconds']:.2f} s)",
                flush=True,
            )
    summary: dict[str, Any] = asdict(row) | {"units": units}
    for target, runs in rounds.items():
        summary[target] = {key: median([run.get(key) for run in runs]) for key in SUMMARY_KEYS}
        summary[target]["rounds"] = runs
    jobq, raw = summary["jobq"]["units_per_s"], summary["raw"]["units_per_s"]
    summary["ratio"] = jobq / raw if jobq and raw else None
    return summary


async def run_once(
    suite: Suite, row: ComposedRow, target: str, units: int, context: str
) -> dict[str, Any]:
    """One run of ``row`` against ``target``, verified; answers its figures."""
    await suite.truncate()
    await suite.admin.execute("TRUNCATE workflows, ordering_keys")
    args: dict[str, Any] = {
        "queue": QUEUE,
        "units": units,
        "in_flight": row.in_flight,
        "workers": row.workers,
        "max_jobs": row.max_jobs,
        "fan": row.fan,
    }
    if target == "jobq":
        args |= {"bases": suite.bases, "server_pids": suite.server_pids, "wait_seconds": 5}
    else:
        args |= {"dsn": suite.dsn}
    before = await suite.statement_counts()
    workload = row.workload if target == "jobq" else f"raw-{row.workload}"
    result = await suite.load(workload, args)
    after = await suite.statement_counts()
    await verify(suite, row, target, units, result, context)

    wall, jobs = result["wall_seconds"], result["jobs"]
    figures: dict[str, Any] = {
        "units": result["units"],
        "jobs": jobs,
        "requests": result["requests"],
        "wall_seconds": wall,
        "units_per_s": len(result["latencies_ms"]) / wall if wall > 0 else None,
        "jobs_per_s": jobs / wall if wall > 0 else None,
        **latency_figures(result["latencies_ms"]),
        "client_cpu_seconds": result["client_cpu_seconds"],
        "client_cpu_share": result["client_cpu_seconds"] / (wall * cores()) if wall else None,
        "server_cpu_ms_per_request": (
            1000 * result["server_cpu_seconds"] / result["requests"]
            if target == "jobq" and result["requests"]
            else None
        ),
        "xids_per_job": (after["xids"] - before["xids"]) / jobs if jobs else None,
        "error_count": result["error_count"],
    }
    return figures


async def verify(
    suite: Suite,
    row: ComposedRow,
    target: str,
    units: int,
    result: dict[str, Any],
    context: str,
) -> None:
    """Every unit ended once, every job succeeded once on its first attempt, and the service's
    own records agree (jobq: a workflow per chain, a callback per batch; raw: counters at 0)."""
    suite.check_errors(result, context)
    expected_jobs = units * row.jobs_per_unit
    ended, completed = result["ended"], result["completed_ids"]
    if result["units"] != units or len(result["latencies_ms"]) != units:
        suite.fail(context, f"{len(result['latencies_ms'])} of {units} units timed")
    if len(ended) != len(set(ended)) or len(ended) != units:
        suite.fail(context, f"{len(ended)} ends ({len(set(ended))} distinct) of {units} units")
    if len(completed) != len(set(completed)):
        suite.fail(context, f"{len(completed) - len(set(completed))} jobs completed twice")
    state = await suite.admin.fetchrow(
        "SELECT count(*) AS total, "
        "count(*) FILTER (WHERE status <> 'succeeded') AS unfinished, "
        "count(*) FILTER (WHERE attempts <> 1) AS reclaimed FROM jobs"
    )
    stored = {r["id"] for r in await suite.admin.fetch("SELECT id FROM jobs")}
    if state["total"] != expected_jobs or stored != set(completed):
        suite.fail(
            context,
            f"{state['total']} rows in jobs, {len(set(completed))} completed, "
            f"{expected_jobs} expected",
        )
    if state["unfinished"]:
        suite.fail(context, f"{state['unfinished']} jobs not succeeded after the run")
    if state["reclaimed"]:
        suite.fail(context, f"{state['reclaimed']} jobs claimed more than once (attempts > 1)")
    if target == "jobq" and row.workload == "chain":
        workflows = await suite.admin.fetchval("SELECT count(*) FROM workflows")
        if workflows != units:
            suite.fail(context, f"{workflows} workflows for {units} chains")
    if target == "jobq" and row.workload == "fanin":
        callbacks = await suite.admin.fetchval(
            "SELECT count(*) FROM jobs WHERE cardinality(depends_on) = $1", row.fan
        )
        if callbacks != units:
            suite.fail(
                context, f"{callbacks} callbacks waiting for {row.fan} jobs, {units} batches"
            )
    if target == "raw" and row.workload == "fanin":
        counters = await suite.admin.fetchrow(
            "SELECT count(*) AS n, count(*) FILTER (WHERE remaining <> 0) AS open FROM bench_fanin"
        )
        if counters["n"] != units or counters["open"]:
            suite.fail(context, f"fan-in counters: {dict(counters)} for {units} batches")


def lines(rows: Sequence[dict[str, Any]]) -> list[str]:
    """The composed rows as a table, then how to read it."""
    columns = [
        ("workload", "<"),
        ("jobq units/s", ">"),
        ("raw units/s", ">"),
        ("jobq÷raw", ">"),
        ("jobs/s jobq / raw", ">"),
        ("latency p50 ms jobq / raw", ">"),
        ("p95 ms jobq / raw", ">"),
        ("server CPU ms/req", ">"),
        ("client CPU jobq / raw", ">"),
        ("xids/job jobq / raw", ">"),
    ]
    cells = []
    for row in rows:
        jobq, raw = row.get("jobq") or {}, row.get("raw") or {}
        cells.append(
            [
                f"{row['label']} ({row['units']:,} {row['unit']})",
                number(jobq.get("units_per_s"), 1),
                number(raw.get("units_per_s"), 1),
                number(row.get("ratio"), 3),
                pair(number(jobq.get("jobs_per_s")), number(raw.get("jobs_per_s"))),
                pair(number(jobq.get("p50_ms"), 1), number(raw.get("p50_ms"), 1)),
                pair(number(jobq.get("p95_ms"), 1), number(raw.get("p95_ms"), 1)),
                number(jobq.get("server_cpu_ms_per_request"), 2),
                pair(percent(jobq.get("client_cpu_share")), percent(raw.get("client_cpu_share"))),
                pair(number(jobq.get("xids_per_job"), 2), number(raw.get("xids_per_job"), 2)),
            ]
        )
    shapes = "; ".join(
        f"{row['label']}: {row['in_flight']} {row['unit']} in flight, {row['workers']} workers "
        f"claiming up to {row['max_jobs']}"
        for row in rows
    )
    return [
        "composed work (issue 21), closed loop: each producer sends one unit and waits for it "
        "to end before the next",
        grid(columns, cells),
        "notes on composed work:",
        f"  - {shapes}. units/s and jobs/s: median over the rounds; jobs/s counts every job of "
        "a unit (a batch's callback too).",
        "  - latency: per unit, from just before its create request (jobq: POST /v1/workflows "
        "or POST /v1/jobs/batch with a callback; raw: the INSERT) was sent to just after the "
        "complete of its last job (step c; the callback) was answered, timed in the load "
        "process; it includes queueing behind the other units in flight.",
        "  - jobq: steps wait in the waiting state; each parent's complete makes its children "
        "due in the same transaction (triggers) and wakes long-polling claims (wait_seconds 5) "
        "by NOTIFY; a child's claim carries its parents' results.",
        "  - raw SQL, the application doing it itself on the same jobs table: the statement "
        "completing a step inserts the next one with the parent's result in its payload; a "
        "fan-in batch inserts a counter row with its jobs, each complete counts its jobs off in "
        "the same statement and the one reaching 0 inserts the callback. No long-poll: an empty "
        "claim pauses 5 ms (RAW_POLL_SECONDS), which each hop may add to raw latency. The raw "
        "producers share 4 connections, as an application's pool would.",
    ]
