"""``python -m bench.deadrows --smoke`` runs end to end on the test server and counts what it must.

The command runs as a subprocess, as a user runs it (a real `jobq serve`, the lean table's
database next to jobq's), with the two drains only. Whatever the service's speed, some counts
are fixed: the lean table takes one insert and two non-HOT updates per job (claim and complete
change ``status``, which its claim index's predicate reads), and under the held horizon nothing
can reclaim them, so each update is still a dead tuple at the end. jobq's ``jobs`` table does at
least as much. Speed is never asserted.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from tests.processes import run_to_end

SMOKE_JOBS = 300
# A guard against a hung run, not a speed limit: the smoke run takes some 20 s here.
RUN_TIMEOUT_SECONDS = 240


@pytest.mark.acceptance
def test_deadrows_smoke_run_verifies_and_counts(pg_server_url: str, tmp_path: Path) -> None:
    figures_path = tmp_path / "deadrows.json"
    # `jobq serve` takes its settings from the environment: the defaults, as a user's would.
    environment = {
        k: v for k, v in os.environ.items() if not k.startswith("JOBQ_") and k != "DATABASE_URL"
    }
    done = run_to_end(
        [
            sys.executable,
            "-m",
            "bench.deadrows",
            "--smoke",
            "--dsn",
            pg_server_url,
            "--json",
            str(figures_path),
        ],
        env=environment,
        timeout=RUN_TIMEOUT_SECONDS,
    )
    assert done.returncode == 0, (done.stdout[-6000:], done.stderr[-3000:])
    assert "verification: passed (4 runs" in done.stdout
    assert "jobq against the lean queue table" in done.stdout

    runs = {
        (run["system"], run["workload"]): run
        for run in json.loads(figures_path.read_text())["runs"]
    }
    assert set(runs) == {(s, w) for s in ("jobq", "lean") for w in ("drain", "drain-held")}
    for key, run in runs.items():
        assert run["failures"] == [], key
        assert run["jobs"] == SMOKE_JOBS, key
        assert run["wal_bytes"]["enqueue"] > 0 and run["wal_bytes"]["drain"] > 0, key
        jobs_table = next(t for t in run["tables"] if t["table"] == "jobs")
        assert jobs_table["inserts"] == SMOKE_JOBS, key
        assert jobs_table["updates"] >= 2 * SMOKE_JOBS, key
    for workload in ("drain", "drain-held"):
        lean = runs[("lean", workload)]
        assert [t["table"] for t in lean["tables"]] == ["jobs"]
        lean_jobs = lean["tables"][0]
        assert (lean_jobs["inserts"], lean_jobs["updates"], lean_jobs["hot_updates"]) == (
            SMOKE_JOBS,
            2 * SMOKE_JOBS,
            0,
        )
        assert lean_jobs["made_dead_per_job"] == 2.0
    held_lean = runs[("lean", "drain-held")]
    assert held_lean["held_xid"] is not None
    assert held_lean["tables"][0]["dead_end"] == 2 * SMOKE_JOBS
    held_jobq = next(t for t in runs[("jobq", "drain-held")]["tables"] if t["table"] == "jobs")
    assert held_jobq["dead_end"] >= 2 * SMOKE_JOBS
    grown = {i["index"] for i in runs[("lean", "drain-held")]["indexes"] if i["growth_per_job"] > 0}
    assert grown <= {"jobs_pkey", "jobs_claimable"}
