"""``python -m bench.rate`` runs end to end at a low rate and verifies itself; speed is never asserted.

One real `jobq serve` and the lean queue's database on the test server, one rate (20 jobs/s for
2 s) with 2 workers: every run must pass the benchmark's own checks (each enqueued job in the
database, done, claimed exactly once) and report the figures the table is made of. PGQueuer's
half is left out to keep this short; ``tests/integration/test_bench_peers.py`` covers its setup.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from bench.rate import main

RUN_FIELDS = {
    "system",
    "workers",
    "rate",
    "offered_per_s",
    "completed_per_s",
    "pickup_ms",
    "pickup_from_schedule_ms",
    "send_lag_ms",
    "producer_behind",
    "depth",
    "load_cpu_share",
    "failures",
    "sustained",
}


@pytest.mark.acceptance
def test_rate_mode_runs_verifies_and_reports(
    pg_server_url: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # `jobq serve` takes its settings from the environment: the defaults, as a user's would.
    for key in [k for k in os.environ if k.startswith("JOBQ_") or k == "DATABASE_URL"]:
        monkeypatch.delenv(key)
    figures_path = tmp_path / "rate.json"
    # In this process (its imports are loaded already); the load still runs in processes of its
    # own and the service in a real `jobq serve`.
    code = main(
        [
            "--dsn",
            pg_server_url,
            "--seconds",
            "2",
            "--rates",
            "20",
            "--workers",
            "2",
            "--systems",
            "jobq,lean",
            "--json",
            str(figures_path),
        ]
    )
    printed = capsys.readouterr().out
    assert code == 0, printed[-6000:]
    assert "highest rate sustained" in printed
    assert "verification: passed" in printed

    figures = json.loads(figures_path.read_text())
    assert figures["verification"] == {"passed": True, "failures": []}
    runs = {run["system"]: run for run in figures["runs"]}
    assert set(runs) == {"jobq", "lean"}
    for name, run in runs.items():
        assert set(run) >= RUN_FIELDS, (name, RUN_FIELDS - set(run))
        assert run["failures"] == [], (name, run["failures"])
        assert (run["workers"], run["rate"]) == (2, 20)
        assert run["jobs_scheduled"] == run["sent"] == 40, name
        assert run["started"] == 40, name
        assert run["started_twice"] == 0, name
        for key in ("p50", "p95", "p99", "max"):
            assert run["pickup_ms"][key] is not None, (name, key)
        assert run["pickup_ms"]["n"] == 40, name
        assert run["pickup_ms"]["p50"] <= run["pickup_ms"]["p99"] <= run["pickup_ms"]["max"]
        assert run["offered_per_s"] > 0 and run["completed_per_s"] > 0, name
        assert run["depth"]["series"], name
        assert set(run["depth"]) == {"series", "min", "median", "max"}
    summary = {(row["system"], row["workers"]) for row in figures["summary"]}
    assert summary == {("jobq", 2), ("lean", 2)}
    for row in figures["summary"]:
        assert {"sustained_rate", "pickup_ms", "first_failed_rate", "first_failed_why"} <= set(row)
