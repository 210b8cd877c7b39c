"""``python -m bench --peers``: PGQueuer's workloads verify themselves, and the flag fails clearly.

The full ``--smoke --peers`` run takes about a minute; here the PGQueuer half alone runs a few
small enqueues and drains on a fresh database (a few seconds) and must pass the checks the
benchmark applies to it. Speed is never asserted.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest

from bench import report
from bench.common import Errors, Meter
from bench.harness import raw_dsn
from bench.load import workloads
from tests.conftest import create_database, drop_database


def test_peers_without_pgqueuer_exits_saying_how_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from bench.__main__ import main

    monkeypatch.setitem(sys.modules, "pgqueuer", None)  # makes `import pgqueuer` fail
    with pytest.raises(SystemExit, match=r"pip install -e '\.\[bench\]'"):
        main(["--smoke", "--peers"])


def test_table_has_pgqueuer_columns_only_with_peers() -> None:
    row = {
        "label": "drain, 1 worker, max_jobs 1",
        "jobq": {"jobs_per_s": 300.0},
        "raw": {"jobs_per_s": 600.0},
        "ratio": 0.5,
        "pgqueuer": {"jobs_per_s": 200.0},
        "ratio_pgqueuer": 1.5,
    }
    with_peers = report.table([row], with_calls=False, with_peers=True).splitlines()
    assert "PGQueuer jobs/s" in with_peers[0]
    assert "jobq÷PGQueuer" in with_peers[0]
    assert "1.500" in with_peers[2]
    assert "PGQueuer" not in report.table([row], with_calls=False)


def test_load_process_knows_the_pgqueuer_workloads() -> None:
    assert {"pgqueuer-enqueue", "pgqueuer-drain"} <= set(workloads())


@pytest.fixture
def base_dsn(pg_server_url: str) -> Iterator[str]:
    """A fresh, empty database for :func:`bench.peers.peer` to put PGQueuer's next to."""
    url = create_database(pg_server_url, prefix="jobq_peers")
    yield raw_dsn(url)
    drop_database(pg_server_url, url)


async def test_pgqueuer_enqueue_and_drain_pass_the_benchmark_checks(base_dsn: str) -> None:
    pytest.importorskip("pgqueuer")
    from bench import peers

    n = 120
    async with peers.peer(base_dsn) as peer:
        for clients, batch in ((1, 1), (4, 1), (2, 50)):
            await peer.truncate()
            args = {"dsn": peer.dsn, "clients": clients, "jobs": n, "batch": batch}
            result = await peers.enqueue(args, Meter([]), errors := Errors())
            assert errors.count == 0, errors.kept
            assert await peer.check_enqueue(result, n) == [], (clients, batch)
            assert result["statements"] == -(-n // batch)

        for workers, max_jobs in ((1, 1), (4, 10)):
            await peer.truncate()
            args = {"dsn": peer.dsn, "clients": 2, "jobs": n, "batch": 50}
            assert await peer.check_enqueue(await peers.enqueue(args, Meter([]), Errors()), n) == []
            preloaded = await peer.queued_ids()
            meter = Meter([])
            args = {"dsn": peer.dsn, "workers": workers, "max_jobs": max_jobs}
            result = await peers.drain(args, meter, errors := Errors())
            assert errors.count == 0, errors.kept
            assert await peer.check_drain(result, preloaded) == [], (workers, max_jobs)
            assert result["jobs"] == n
            assert meter.wall_seconds > 0

        # The checks catch a job handled twice and one never handled, left in the queue.
        await peer.truncate()
        args = {"dsn": peer.dsn, "clients": 1, "jobs": n, "batch": 50}
        await peers.enqueue(args, Meter([]), Errors())
        preloaded = await peer.queued_ids()
        handled = sorted(preloaded)[1:]  # the first never handled, the second twice
        failures = await peer.check_drain({"completed_ids": [*handled, handled[0]]}, preloaded)
        assert any("more than once" in failure for failure in failures), failures
        assert any("never handled" in failure for failure in failures), failures
        assert any(f"{n} rows left" in failure for failure in failures), failures
