"""What ``python -m bench.rate`` prints: the settings, one line per run, the table and the notes."""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

SPARKS = "▁▂▃▄▅▆▇█"
SPARK_WIDTH = 40  # a longer depth series is shown as the max of each of this many buckets


def number(value: float | None, digits: int = 0) -> str:
    """``value`` with thousands separators, or a dash when unknown."""
    return "-" if value is None else f"{value:,.{digits}f}"


def depth_figures(series: Sequence[int]) -> dict[str, Any]:
    """Min, median and max of the sampled queue depth, with the series itself."""
    if not series:
        return {"series": [], "min": None, "median": None, "max": None}
    return {
        "series": list(series),
        "min": min(series),
        "median": statistics.median(series),
        "max": max(series),
    }


def sparkline(series: Sequence[int]) -> str:
    """The series as block characters scaled to its max (bucketed to :data:`SPARK_WIDTH`)."""
    if not series:
        return ""
    if len(series) > SPARK_WIDTH:
        size = len(series) / SPARK_WIDTH
        series = [
            max(series[int(i * size) : max(int(i * size) + 1, int((i + 1) * size))])
            for i in range(SPARK_WIDTH)
        ]
    top = max(series)
    if top == 0:
        return SPARKS[0] * len(series)
    return "".join(
        SPARKS[min(len(SPARKS) - 1, int(v / top * (len(SPARKS) - 1) + 0.5))] for v in series
    )


def run_line(run: dict[str, Any]) -> str:
    """One run: offered and completed rates, pickup percentiles, depth, the load's CPU, verdict."""
    head = f"  {run['system']:<8} W {run['workers']:<3} {number(run['rate']):>7}/s"
    if "pickup_ms" not in run:
        return f"{head}  FAILED: {'; '.join(run['failures'])}"
    pickup, depth, lag = run["pickup_ms"], run["depth"], run["send_lag_ms"]
    text = (
        f"{head}  offered {number(run['offered_per_s'])}/s  done {number(run['completed_per_s'])}/s"
        f"  pickup p50 {number(pickup['p50'], 1)} p95 {number(pickup['p95'], 1)}"
        f" p99 {number(pickup['p99'], 1)} max {number(pickup['max'], 1)} ms"
        f"  depth {sparkline(depth['series'])} median {number(depth['median'])}"
        f" max {number(depth['max'])}"
        f"  load CPU {number(100 * run['load_cpu_share'])} %"
    )
    if run["producer_behind"]:
        text += (
            f"  PRODUCER BEHIND (lag p99 {number(lag['p99'], 1)} ms, max {number(lag['max'])} ms,"
            f" {number(run['late_sends'])} late sends; pickup p99 from the schedule "
            f"{number(run['pickup_from_schedule_ms']['p99'], 1)} ms)"
        )
    if run["failures"]:
        return f"{text}  VERIFICATION FAILED: {'; '.join(run['failures'])}"
    return f"{text}  {'ok' if run['sustained'] else 'not sustained: ' + run['why']}"


def table(summary: Sequence[dict[str, Any]], target_p99_ms: float, min_completion: float) -> str:
    """System, W, the highest rate sustained with its pickup p50/p95/p99, and the next rate's fate."""
    lines = [
        f"highest rate sustained (pickup p99 <= {target_p99_ms:g} ms and completed >= "
        f"{min_completion:.0%} of the rate):",
        f"  {'system':<9}{'W':>3}  {'sustained R/s':>13}  {'p50 ms':>7}  {'p95 ms':>7}  "
        f"{'p99 ms':>7}  {'done/s':>7}  {'max depth':>9}  next rate tried",
    ]
    for row in summary:
        best = row["best"]
        failed = row["first_failed"]
        if failed is None:
            after = "none (top of --rates)"
        else:
            after = f"{number(failed['rate'])}/s: {failed['why']}"
        if best is None:
            lines.append(
                f"  {row['system']:<9}{row['workers']:>3}  {'none':>13}  {'-':>7}  {'-':>7}  "
                f"{'-':>7}  {'-':>7}  {'-':>9}  {after}"
            )
            continue
        pickup = best["pickup_ms"]
        behind = "*" if best["producer_behind"] else " "
        lines.append(
            f"  {row['system']:<9}{row['workers']:>3}  {number(best['rate']):>12}{behind}  "
            f"{number(pickup['p50'], 2):>7}  {number(pickup['p95'], 2):>7}  "
            f"{number(pickup['p99'], 2):>7}  {number(best['completed_per_s']):>7}  "
            f"{number(best['depth']['max']):>9}  {after}"
        )
    if any(row["best"] and row["best"]["producer_behind"] for row in summary):
        lines.append("  * the producer fell behind its schedule in that run (see its line)")
    return "\n".join(lines)


def settings_lines(settings: dict[str, Any]) -> list[str]:
    """The block at the top: the server, the machine, the systems and the plan."""
    pg, o = settings["postgresql"], settings["options"]
    lines = [
        "jobq fixed-rate benchmark: python -m bench.rate",
        f"  PostgreSQL {pg['server_version']} ({settings['server']}), database "
        f"{settings['database']}; synchronous_commit {pg['synchronous_commit']}, fsync "
        f"{pg['fsync']}, shared_buffers {pg['shared_buffers']}, max_connections "
        f"{pg['max_connections']}",
        f"  one commit here (a one-row INSERT, autocommit, {settings['commit_probes']} in a row): "
        f"p50 {number(pg['commit_ms']['p50'], 2)} ms, max {number(pg['commit_ms']['max'], 2)} ms",
        f"  cores {settings['cores']}, Python {settings['python']}",
        f"  systems {','.join(o['systems'])}; rates {','.join(number(r) for r in o['rates'])} "
        f"jobs/s, {o['seconds']:g} s each; workers {','.join(str(w) for w in o['workers'])}",
    ]
    if settings["jobq"]:
        lines.append(f"  jobq: 1 `jobq serve` instance ({settings['jobq']})")
    if settings["pgqueuer"]:
        lines.append(f"  PGQueuer {settings['pgqueuer']} in the load process")
    return lines


NOTES = """notes:
  - open loop: job n is due at t0 + n/R, fixed before the run; each is sent at its time on a free
    producer client (opened on demand up to 32 HTTP connections for jobq, 10 PostgreSQL
    connections for lean and PGQueuer), never waiting for earlier answers. A send waits only when
    every client is busy: its lag (send less due time) is measured, and a run whose p99 lag is
    over 10 ms is marked PRODUCER BEHIND, with its pickup p99 counted from the due times too.
  - one job per enqueue: jobq POST /v1/jobs; lean one INSERT; PGQueuer Queries.enqueue(one job).
  - pickup latency: from the send of the job's enqueue to the start of its work in a worker, both
    on the load process's monotonic clock, over every job of the run (the drain included).
  - work: asyncio.sleep(0.001) per job (about 1.1 ms with the event loop's timer): it holds the
    worker without using the load process's CPU, as busy work at these rates would.
  - workers, each taking one job at a time: jobq, W keep-alive connections, each completing its
    job with claim_next (max_jobs 1, no wait: its next job in the same request, as jobq_client's
    Worker does) and long-polling POST /v1/claim (max_jobs 1, wait_seconds 5) only when that
    claimed none; lean, W connections
    claiming one row (FOR UPDATE SKIP LOCKED) then completing it (an UPDATE checked against the
    lease), woken by LISTEN/NOTIFY (a statement trigger notifies per insert; one listener wakes
    one idle worker per notification); PGQueuer, W QueueManagers on a connection each,
    batch_size 1 (each acknowledgement flushed at once), its own LISTEN waking every idle
    manager; a manager dequeues its next job without waiting for its handler. Lean and PGQueuer
    look again after 1 s without a wake-up, as jobq re-checks its parked claims.
  - offered/s: enqueues sent within the R-second window, per second (R when the producer kept
    its schedule); done/s: jobs done within the window, per second (jobq and lean: complete
    answered; PGQueuer: handler returned). A rate is sustained when pickup p99 <= the target and
    done/s >= the share of R; each system's ladder at each W stops at its first rate that is not.
  - depth: jobs waiting to be picked (jobq and lean status 'pending', PGQueuer 'queued'), sampled
    from the database every second from the schedule's start until the run has drained.
  - verification: after every run, every enqueued job is in the database, done, and was claimed
    exactly once (jobq attempts = 1 and succeeded; lean attempts = 1 and done; PGQueuer one
    'picked' and one 'successful' log row, queue empty), and the load saw each done once.
  - one load process per run (asyncio, one core at most): 'load CPU' is its share of one core; near
    100 % the load itself limits the figures. Every job costs each system at least three commits
    (enqueue, claim, complete): see the commit cost above. All systems share the machine with
    PostgreSQL and jobq serve (which stays up during the others' runs): figures are indicative."""


def document(
    settings: dict[str, Any],
    runs: Sequence[dict[str, Any]],
    summary: Sequence[dict[str, Any]],
    failures: Sequence[str],
    duration_seconds: float,
) -> dict[str, Any]:
    """Every figure, for ``--json``: the settings, each run, the table's rows and the verdict."""
    rows = []
    for row in summary:
        best, failed = row["best"], row["first_failed"]
        rows.append(
            {
                "system": row["system"],
                "workers": row["workers"],
                "sustained_rate": best["rate"] if best else None,
                "pickup_ms": best["pickup_ms"] if best else None,
                "first_failed_rate": failed["rate"] if failed else None,
                "first_failed_why": failed["why"] if failed else None,
            }
        )
    return {
        "settings": settings,
        "runs": list(runs),
        "summary": rows,
        "verification": {"passed": not failures, "failures": list(failures)},
        "duration_seconds": duration_seconds,
    }


def write_json(path: Path, document: dict[str, Any]) -> None:
    """Writes every figure as JSON."""
    path.write_text(json.dumps(document, indent=2, default=str) + "\n")
