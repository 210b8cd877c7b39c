"""``python -m bench --smoke`` runs end to end on the test session's PostgreSQL and verifies itself.

Speed is never asserted: only that every workload ran, produced positive figures and passed the
benchmark's own verification (every enqueue counted, every drained job succeeded exactly once),
on jobq, on raw SQL on its schema and on the lean queue table (every row but those with
concurrency keys), and that the claim and complete latency block without and with API keys is printed, its runs
with keys having sent the key and passed the same checks.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from tests.processes import run_to_end

ROW_KEYS = {
    "enqueue_single_1",
    "enqueue_single_16",
    "enqueue_batch500_4",
    "drain_1_max1",
    "drain_4_max1",
    "drain_16_max1",
    "drain_1_max50",
    "drain_4_max50",
    "drain_16_max50",
    "drain_16_max1_keys",
    "drain_16_max50_keys",
}
KEYED_ROWS = {"drain_16_max1_keys", "drain_16_max50_keys"}  # on jobq's schema only
TIMEOUT_SECONDS = 300  # about a minute, three on a busy machine; a hang fails here, not the suite


@pytest.mark.acceptance
def test_bench_smoke_runs_and_verifies(pg_server_url: str, tmp_path: Path) -> None:
    figures_path = tmp_path / "bench.json"
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith("JOBQ_") and key != "DATABASE_URL"
    }
    completed = run_to_end(
        [
            sys.executable,
            "-m",
            "bench",
            "--smoke",
            "--dsn",
            pg_server_url,
            "--json",
            str(figures_path),
        ],
        env=env,
        timeout=TIMEOUT_SECONDS,
    )
    output = completed.stdout + completed.stderr
    assert completed.returncode == 0, output[-6000:]

    figures = json.loads(figures_path.read_text())
    assert figures["verification"] == {"passed": True, "failures": []}
    rows = {row["key"]: row for row in figures["rows"]}
    assert set(rows) == ROW_KEYS
    for key, row in rows.items():
        for target in ("jobq", "raw"):
            assert row[target]["jobs_per_s"] > 0, (key, target)
            assert row[target]["rounds"], (key, target)
        assert row["ratio"] > 0, key
        assert row["jobq"]["server_cpu_ms_per_request"] >= 0, key
        if key in KEYED_ROWS:
            assert row["lean"] is None, key
            assert row["ratio_lean"] is None and row["ratio_raw_lean"] is None, key
            continue
        assert row["lean"]["jobs_per_s"] > 0, key
        assert row["lean"]["rounds"], key
        assert row["ratio_lean"] > 0 and row["ratio_raw_lean"] > 0, key
    assert figures["settings"]["lean"]["database"].endswith("_lean")
    assert "schema÷lean" in output

    latency = figures["latency"]
    assert latency["n"] == figures["settings"]["options"]["latency_jobs"]
    assert latency["p99_ms"] > 0

    history = figures["history"]
    for phase in ("empty", "long"):
        assert history[phase]["n"] > 0
        assert history[phase]["p50_ms"] > 0
    assert history["ratio_p50"] > 0

    soak = figures["soak"]
    assert soak["completed"] == soak["enqueued"] > 0
    assert all(rss > 0 for rss in soak["rss_start_bytes"] + soak["rss_end_bytes"])
    assert sum(soak["backends_peak"].values()) > 0

    # Claim and complete without keys, then with an admin key once every instance wanted it.
    auth = figures["auth"]
    samples = auth["jobs"] * auth["rounds"]
    assert auth["jobs"] == figures["settings"]["options"]["auth_jobs"] > 0
    assert all(seconds is not None for seconds in auth["auth_on_seconds"])
    for phase, keys in (("without_keys", False), ("with_keys", True)):
        assert auth[phase]["failures"] == [], phase
        assert [run["keys"] for run in auth[phase]["rounds"]] == [keys] * auth["rounds"], phase
        for what in ("claim", "complete"):
            assert auth[phase][what]["n"] == samples, (phase, what)
            assert auth[phase][what]["p50_ms"] > 0, (phase, what)
    assert "claim latency p50/p99: " in output
    assert "complete latency p50/p99: " in output
    assert "ms with keys (" in output
    assert "VERIFICATION FAILED" not in output
