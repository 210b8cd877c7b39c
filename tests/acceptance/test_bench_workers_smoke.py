"""``python -m bench.workers --smoke`` runs end to end on the test session's PostgreSQL and
verifies itself: every run of the bare loops, the Worker, an earlier Worker (``--before``, here
this checkout's own) and the TypeScript and Go Workers (through their contract drivers, built
by the bench) drained its queue, each job ran exactly once. Speed is never asserted."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from tests.processes import run_to_end

REPO_ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_SECONDS = (
    600  # npm ci and two builds included; a hang fails here instead of stalling the suite
)


@pytest.mark.acceptance
def test_bench_workers_smoke_runs_and_verifies(pg_server_url: str, tmp_path: Path) -> None:
    figures_path = tmp_path / "workers.json"
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith("JOBQ_") and key != "DATABASE_URL"
    }
    completed = run_to_end(
        [
            sys.executable,
            "-m",
            "bench.workers",
            "--smoke",
            "--jobs",
            "60",
            "--concurrency",
            "1,16",
            "--before",
            str(REPO_ROOT),
            "--claim-ahead",
            "4",
            "--dsn",
            pg_server_url,
            "--json",
            str(figures_path),
        ],
        env=env,
        timeout=TIMEOUT_SECONDS,
    )
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    assert "verification: passed (24 runs" in completed.stdout, completed.stdout
    figures = json.loads(figures_path.read_text())
    assert figures["failures"] == []
    runs = figures["runs"]
    assert {(r["concurrency"], r["handler"], r["mode"]) for r in runs} == {
        (n, handler, mode)
        for n in (1, 16)
        for handler in ("noop", "sleep1ms")
        for mode in ("bare", "lean", "worker", "before", "typescript", "go")
    }
    assert all(r["jobs_per_s"] > 0 for r in runs)
    # The Python modes' CPU is their own process's (process_time); a driver's is read from /proc
    # in clock ticks (10 ms), which 60 fast jobs may not fill.
    assert all(
        r["client_cpu_ms_per_job"] > 0 for r in runs if r["mode"] not in ("typescript", "go")
    )
    assert all(r["client_cpu_ms_per_job"] >= 0 for r in runs)
