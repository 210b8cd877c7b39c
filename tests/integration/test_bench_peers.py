"""The bench's siblings verify themselves: the lean queue table, and ``--peers``' PGQueuer and
Procrastinate; the flag fails clearly without them.

The full ``--smoke --peers`` run takes about a minute; here each sibling alone runs a few small
enqueues and drains on a fresh database (a few seconds each) and must pass the checks the
benchmark applies to it, and the checks must catch a job done twice and one never done. Speed
is never asserted.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest

from bench import baseline, lean, report
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


def test_peers_without_procrastinate_exits_saying_how_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pytest.importorskip("pgqueuer")
    from bench.__main__ import main

    monkeypatch.setitem(sys.modules, "procrastinate", None)
    with pytest.raises(SystemExit, match=r"Procrastinate.*pip install -e '\.\[bench\]'"):
        main(["--smoke", "--peers"])


PEERS = [("pgqueuer", "PGQueuer"), ("procrastinate", "Procrastinate")]


def test_table_has_the_lean_columns_and_the_peers_only_with_peers() -> None:
    row = {
        "label": "drain, 1 worker, max_jobs 50",
        "jobq": {"jobs_per_s": 300.0},
        "raw": {"jobs_per_s": 600.0},
        "lean": {"jobs_per_s": 1200.0, "xids_per_job": 2.0},
        "ratio": 0.5,
        "ratio_lean": 0.25,
        "ratio_raw_lean": 0.5,
        "pgqueuer": {"jobs_per_s": 200.0},
        "ratio_pgqueuer": 1.5,
        "procrastinate": None,  # not run: one job per fetch
        "ratio_procrastinate": None,
    }
    dash = report.NOT_RUN
    jobs, _, costs = report.table([row], with_calls=False, peers=PEERS).partition("\n\n")
    header, _, line = jobs.splitlines()
    titles = ["jobq jobs/s", "schema jobs/s", "lean jobs/s", "jobq÷lean", "jobq÷schema"]
    titles += ["schema÷lean", "PGQueuer jobs/s", "jobq÷PGQueuer", "Procrastinate jobs/s"]
    positions = [header.index(title) for title in titles]
    assert positions == sorted(positions)
    assert line.split()[-10:] == [
        *("300", "600", "1,200", "0.250", "0.500", "0.500"),
        *("200", "1.500", dash, dash),
    ]
    assert "xids/job jobq / schema / lean" in costs.splitlines()[0]
    assert "n/a / n/a / 2.00" in costs
    assert "PGQueuer" not in report.table([row], with_calls=False)

    keyed = row | {"lean": None, "ratio_lean": None, "ratio_raw_lean": None}
    cells = report.table([keyed], with_calls=False).splitlines()[2].split()
    assert cells[-6:] == ["300", "600", dash, dash, "0.500", dash]
    assert f"n/a / n/a / {dash}" in report.costs([keyed], with_calls=False)  # xids: lean not run


def test_load_process_knows_the_peers_workloads() -> None:
    assert {"pgqueuer-enqueue", "pgqueuer-drain"} <= set(workloads())
    assert {"procrastinate-enqueue", "procrastinate-drain"} <= set(workloads())


@pytest.fixture
def base_dsn(pg_server_url: str) -> Iterator[str]:
    """A fresh, empty database for the siblings to put theirs next to."""
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


async def test_lean_table_runs_the_baseline_and_passes_the_benchmark_checks(base_dsn: str) -> None:
    n = 120
    async with lean.lean(base_dsn) as table:
        # Only what a queue needs: no trigger, the primary key and the claim index.
        triggers = await table.admin.fetchval(
            "SELECT count(*) FROM pg_trigger WHERE tgrelid = 'jobs'::regclass AND NOT tgisinternal"
        )
        indexes = await table.admin.fetch(
            "SELECT indexname FROM pg_indexes WHERE tablename = 'jobs'"
        )
        assert triggers == 0
        assert {row["indexname"] for row in indexes} == {"jobs_pkey", "jobs_claimable"}

        for clients, batch in ((1, 1), (4, 1), (2, 50)):
            await table.truncate()
            args = {
                "dsn": table.dsn,
                "queue": "bench",
                "clients": clients,
                "jobs": n,
                "batch": batch,
            }
            result = await baseline.enqueue(args, Meter([]), errors := Errors())
            assert errors.count == 0, errors.kept
            assert await table.check_enqueue(result, n) == [], (clients, batch)
            assert result["statements"] == -(-n // batch)

        for workers, max_jobs in ((1, 1), (4, 10)):
            await table.truncate()
            loaded = await baseline.insert_batches(table.admin, queue="bench", jobs=n, batch=50)
            assert loaded["error_count"] == 0, loaded["errors"]
            assert await table.check_enqueue(loaded, n) == []
            preloaded = await table.queued_ids()
            meter = Meter([])
            args = {"dsn": table.dsn, "queue": "bench", "workers": workers, "max_jobs": max_jobs}
            result = await baseline.drain(args, meter, errors := Errors())
            assert errors.count == 0, errors.kept
            assert await table.check_drain(result, preloaded) == [], (workers, max_jobs)
            assert result["jobs"] == n
            assert meter.wall_seconds > 0

        # The checks catch a job completed twice and one never completed, left pending.
        await table.truncate()
        await baseline.insert_batches(table.admin, queue="bench", jobs=n, batch=50)
        preloaded = await table.queued_ids()
        done = sorted(preloaded)[1:]  # the first never completed, the second twice
        await table.admin.execute(
            "UPDATE jobs SET status = 'succeeded', attempts = 1 WHERE id = ANY($1)", done
        )
        failures = await table.check_drain({"completed_ids": [*done, done[0]]}, preloaded)
        assert any("more than once" in failure for failure in failures), failures
        assert any("never completed" in failure for failure in failures), failures
        assert any("1 jobs not succeeded" in failure for failure in failures), failures


async def test_procrastinate_enqueue_and_drain_pass_the_benchmark_checks(base_dsn: str) -> None:
    pytest.importorskip("procrastinate")
    from bench import procrastinate_peer

    n = 40  # a defer is several round trips (a pool check, BEGIN, the statement, COMMIT)
    async with procrastinate_peer.peer(base_dsn) as peer:
        assert peer.runs(max_jobs=1, keys=0)
        assert not peer.runs(max_jobs=50, keys=0)
        assert not peer.runs(max_jobs=1, keys=20)
        for clients, batch in ((1, 1), (4, 1), (2, 25)):
            await peer.truncate()
            args = {"dsn": peer.dsn, "clients": clients, "jobs": n, "batch": batch}
            result = await procrastinate_peer.enqueue(args, Meter([]), errors := Errors())
            assert errors.count == 0, errors.kept
            assert await peer.check_enqueue(result, n) == [], (clients, batch)
            assert result["statements"] == -(-n // batch)

        for workers in (1, 4):
            await peer.truncate()
            args = {"dsn": peer.dsn, "clients": 2, "jobs": n, "batch": 25}
            loaded = await procrastinate_peer.enqueue(args, Meter([]), Errors())
            assert await peer.check_enqueue(loaded, n) == []
            preloaded = await peer.queued_ids()
            meter = Meter([])
            args = {"dsn": peer.dsn, "workers": workers, "max_jobs": 1}
            result = await procrastinate_peer.drain(args, meter, errors := Errors())
            assert errors.count == 0, errors.kept
            assert await peer.check_drain(result, preloaded) == [], workers
            assert result["jobs"] == n
            # A fetch and a finish per job, the empty fetch and the start and stop of each worker
            # (and, past 5 s, its look for jobs to abort).
            assert result["statements"] >= 2 * n + 4 * workers
            assert meter.wall_seconds > 0

        # The checks catch a job handled twice and one never handled, left to do.
        await peer.truncate()
        args = {"dsn": peer.dsn, "clients": 1, "jobs": n, "batch": 25}
        await procrastinate_peer.enqueue(args, Meter([]), Errors())
        preloaded = await peer.queued_ids()
        handled = sorted(preloaded)[1:]  # the first never handled, the second twice
        failures = await peer.check_drain({"completed_ids": [*handled, handled[0]]}, preloaded)
        assert any("more than once" in failure for failure in failures), failures
        assert any("never handled" in failure for failure in failures), failures
        assert any(f"{n} jobs not succeeded" in failure for failure in failures), failures
