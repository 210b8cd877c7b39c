"""``python -m bench.claimwalk`` runs end to end on the test server and shows the walk it measures.

Buffers, unlike times, do not depend on the machine's load: behind a held horizon every job taken
ahead of the first pending one leaves an index entry and a heap version the claim must visit, so
the service's claim touches more buffers with 2,000 taken jobs ahead than with none, and a walk
that starts at the first pending job's key touches fewer than the claim does. Speed is never
asserted.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from tests.processes import run_to_end

RUN_TIMEOUT_SECONDS = 240  # a guard against a hung run, not a speed limit (some 5 s here)


@pytest.mark.acceptance
def test_claimwalk_shows_the_claim_walking_taken_jobs(pg_server_url: str, tmp_path: Path) -> None:
    figures_path = tmp_path / "claimwalk.json"
    environment = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    done = run_to_end(
        [
            sys.executable,
            "-m",
            "bench.claimwalk",
            "--dsn",
            pg_server_url,
            "--dead",
            "0,2000",
            "--repeat",
            "1",
            "--json",
            str(figures_path),
        ],
        env=environment,
        timeout=RUN_TIMEOUT_SECONDS,
    )
    assert done.returncode == 0, (done.stdout[-4000:], done.stderr[-4000:])
    figures = json.loads(figures_path.read_text())["figures"]
    assert [f["taken_ahead"] for f in figures] == [0, 2000]
    none_ahead, taken_ahead = figures
    assert taken_ahead["claim_buffers"] > none_ahead["claim_buffers"] + 20, figures
    assert taken_ahead["cursor_buffers"] < taken_ahead["claim_buffers"], figures
