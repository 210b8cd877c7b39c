"""``python -m bench --smoke --only chain,fanin``: the composed-work rows run and verify themselves.

The full smoke run (``test_bench_smoke.py``) runs these rows too and fails on their
verification; this one, quick (about 15 s), looks at their figures: every unit timed on both
targets (jobq and the raw-SQL baseline), and the table printed. Speed is never asserted.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_SECONDS = 120


@pytest.mark.acceptance
def test_bench_composed_rows_run_and_verify(pg_server_url: str, tmp_path: Path) -> None:
    figures_path = tmp_path / "bench.json"
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith("JOBQ_") and key != "DATABASE_URL"
    }
    command = [sys.executable, "-m", "bench", "--smoke", "--only", "chain,fanin"]
    completed = subprocess.run(
        [*command, "--chains", "20", "--dsn", pg_server_url, "--json", str(figures_path)],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_SECONDS,
        check=False,
    )
    output = completed.stdout + completed.stderr
    assert completed.returncode == 0, output[-6000:]

    figures = json.loads(figures_path.read_text())
    assert figures["verification"] == {"passed": True, "failures": []}
    assert figures["rows"] == [] and figures["soak"] == {} and figures["auth"] == {}
    composed = {row["key"]: row for row in figures["composed"]}
    assert set(composed) == {"chain3", "fanin100"}
    assert composed["chain3"]["units"] == 20
    for key, row in composed.items():
        for target in ("jobq", "raw"):
            figures_of = row[target]
            assert figures_of["units_per_s"] > 0 and figures_of["jobs_per_s"] > 0, (key, target)
            assert figures_of["p95_ms"] >= figures_of["p50_ms"] > 0, (key, target)
            [run] = figures_of["rounds"]
            assert run["units"] == row["units"] and run["n"] == row["units"], (key, target)
            assert run["jobs"] == row["units"] * row["jobs_per_unit"], (key, target)
        assert row["ratio"] > 0, key
        assert row["jobq"]["server_cpu_ms_per_request"] > 0, key
    assert "composed work (issue 21)" in output
    assert "VERIFICATION FAILED" not in output


def test_only_refuses_an_unknown_section() -> None:
    completed = subprocess.run(
        [sys.executable, "-m", "bench", "--only", "chain,nope"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert completed.returncode == 2
    assert "unknown section(s) nope" in completed.stderr
