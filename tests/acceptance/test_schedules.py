"""Periodic jobs with real ``jobq serve`` processes: leader changes, restarts, the schedules file.

Every check reads the jobs table: one job per run instant (the scheduler marks it with its run), no
doubles, and no gaps beyond what a schedule's catch_up allows.
"""

from __future__ import annotations

import asyncio
import itertools
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.polling import poll_until
from tests.processes import REPO_ROOT, JobqServer, JobqServers, clean_environment, free_port

pytestmark = pytest.mark.acceptance

# A fast scheduler and a fast election, so a leader change takes a fraction of a second.
ENV = {"JOBQ_SCHEDULER_INTERVAL_SECONDS": "0.1", "JOBQ_ELECTION_INTERVAL_SECONDS": "0.3"}
QUEUE = "periodic-acceptance"


@pytest.fixture(autouse=True)
async def no_schedules_left(clean_db: AsyncEngine) -> AsyncIterator[None]:
    """Empty tables before (clean_db); no schedule left for later tests' servers after."""
    yield
    async with clean_db.begin() as conn:
        await conn.execute(text("TRUNCATE schedules"))


async def runs(engine: AsyncEngine, name: str) -> list[dict[str, Any]]:
    """The jobs of a schedule's runs, by due time."""
    async with engine.connect() as conn:
        result = await conn.execute(
            text(
                "SELECT id, run_at, created_at, schedule_name, scheduled_for FROM jobs "
                "WHERE schedule_name = :name ORDER BY run_at, id"
            ),
            {"name": name},
        )
        return [dict(r) for r in result.mappings()]


def assert_one_job_per_run(jobs: Sequence[dict[str, Any]], name: str) -> None:
    keys = [(j["schedule_name"], j["scheduled_for"]) for j in jobs]
    assert len(keys) == len(set(keys)), "a run was enqueued twice"
    for job in jobs:
        assert (job["schedule_name"], job["scheduled_for"]) == (name, job["run_at"])
    instants = [j["run_at"] for j in jobs]
    assert len(instants) == len(set(instants))


async def db_clock(engine: AsyncEngine) -> datetime:
    async with engine.connect() as conn:
        value: datetime = (await conn.execute(text("SELECT clock_timestamp()"))).scalar_one()
        return value


async def is_leader(server: JobqServer) -> bool:
    try:
        async with httpx.AsyncClient(base_url=server.url, timeout=2) as client:
            scrape = await client.get("/metrics")
    except httpx.TransportError:
        return False
    return "jobq_leader 1.0" in scrape.text


async def leader_among(servers: Sequence[JobqServer]) -> JobqServer:
    found: list[JobqServer] = []

    async def one() -> bool:
        leaders = [s for s in servers if s.process.poll() is None and await is_leader(s)]
        found[:] = leaders
        return len(leaders) == 1

    await poll_until(one, within=10, what="exactly one leader")
    return found[0]


async def just_before_a_second(engine: AsyncEngine) -> None:
    """Returns when the database's clock is in the last fifth of a second: just before a run."""

    async def late_in_the_second() -> bool:
        return (await db_clock(engine)).microsecond >= 800_000

    await poll_until(late_in_the_second, within=5, what="the end of a second", interval=0.01)


async def test_leader_changes_across_due_times_enqueue_each_run_exactly_once(
    jobq_servers: JobqServers, clean_db: AsyncEngine
) -> None:
    servers = [await jobq_servers.start(ENV), await jobq_servers.start(ENV)]
    async with httpx.AsyncClient(base_url=servers[0].url) as client:
        made = await client.put(
            "/v1/schedules/every-second",
            json={"cron": "* * * * * *", "catch_up": 10, "template": {"queue": QUEUE, "type": "t"}},
        )
        assert made.status_code == 201, made.text

    async def at_least(count: int) -> bool:
        return len(await runs(clean_db, "every-second")) >= count

    await poll_until(lambda: at_least(3), within=10, what="the first runs")
    # kill -9 the leader just before a run is due; the other instance takes over.
    leader = await leader_among(servers)
    await just_before_a_second(clean_db)
    leader.send_signal(signal.SIGKILL)
    assert await leader.wait_exit(5) is not None
    survivors = [s for s in servers if s is not leader]
    before = len(await runs(clean_db, "every-second"))
    await leader_among(survivors)
    await poll_until(lambda: at_least(before + 3), within=10, what="runs after the kill")

    # A fresh instance joins; the leader is then stopped gracefully just before a run.
    survivors.append(await jobq_servers.start(ENV))
    leader = await leader_among(survivors)
    await just_before_a_second(clean_db)
    leader.send_signal(signal.SIGTERM)
    assert await leader.wait_exit(15) == 0
    remaining = [s for s in survivors if s is not leader]
    before = len(await runs(clean_db, "every-second"))
    await leader_among(remaining)
    await poll_until(lambda: at_least(before + 3), within=10, what="runs after the stop")

    async with httpx.AsyncClient(base_url=remaining[0].url) as client:
        assert (await client.post("/v1/schedules/every-second/pause")).status_code == 200
    jobs = await runs(clean_db, "every-second")
    assert_one_job_per_run(jobs, "every-second")
    steps = {b["run_at"] - a["run_at"] for a, b in itertools.pairwise(jobs)}
    assert steps == {timedelta(seconds=1)}, "a run is missing (catch_up 10 covers a failover)"


async def test_missed_runs_after_a_restart_are_caught_up_within_catch_up(
    jobq_servers: JobqServers, clean_db: AsyncEngine
) -> None:
    server = await jobq_servers.start(ENV)
    async with httpx.AsyncClient(base_url=server.url) as client:
        made = await client.put(
            "/v1/schedules/tick",
            json={"interval_seconds": 1, "catch_up": 2, "template": {"queue": QUEUE, "type": "t"}},
        )
        assert made.status_code == 201, made.text

    async def some_runs() -> bool:
        return len(await runs(clean_db, "tick")) >= 2

    await poll_until(some_runs, within=10, what="the first runs")
    server.send_signal(signal.SIGTERM)
    assert await server.wait_exit(15) == 0
    before = await runs(clean_db, "tick")
    async with clean_db.connect() as conn:
        stopped_at: datetime = (
            await conn.execute(text("SELECT next_run_at FROM schedules WHERE name = 'tick'"))
        ).scalar_one()
    assert stopped_at == before[-1]["run_at"] + timedelta(seconds=1)

    async def down_for_a_while() -> bool:  # about six runs come due while nothing runs
        return await db_clock(clean_db) > stopped_at + timedelta(seconds=6)

    await poll_until(down_for_a_while, within=15, what="six missed runs")
    await jobq_servers.start(ENV)

    async def caught_up() -> bool:
        return len(await runs(clean_db, "tick")) >= len(before) + 3

    await poll_until(caught_up, within=15, what="the catch-up after the restart")
    jobs = await runs(clean_db, "tick")
    assert_one_job_per_run(jobs, "tick")
    after = jobs[len(before) :]
    first_pass_at = min(j["created_at"] for j in after)
    first_pass = [j["run_at"] for j in after if j["created_at"] == first_pass_at]
    # The runs due by then: the grid from where it stopped, up to the pass's now(); the latest
    # one (current) and catch_up=2 missed ones are enqueued, older ones skipped.
    due = [stopped_at + timedelta(seconds=k) for k in range(60)]
    due = [r for r in due if r <= first_pass_at]
    assert len(due) >= 6
    assert first_pass == due[-3:]
    assert all(j["run_at"] > first_pass[-1] for j in after if j["created_at"] != first_pass_at)
    assert "missed more runs than its catch_up (2)" in jobq_servers.servers[-1].log_text()


TOML_FILE = """
[[schedules]]
name = "nightly"
cron = "30 2 * * *"
timezone = "Europe/Berlin"
catch_up = 1
[schedules.template]
queue = "reports"
type = "nightly-report"
payload = { format = "pdf" }

[[schedules]]
name = "poll"
interval_seconds = 300
template = { queue = "feeds", type = "poll", priority = 5 }

[[schedules]]
name = "old"
cron = "@daily"
template = { type = "old" }
"""

# The next version: nightly as it was, poll retimed, old gone, hourly new.
TOML_FILE_2 = """
[[schedules]]
name = "nightly"
cron = "30 2 * * *"
timezone = "Europe/Berlin"
catch_up = 1
[schedules.template]
queue = "reports"
type = "nightly-report"
payload = { format = "pdf" }

[[schedules]]
name = "poll"
interval_seconds = 600
template = { queue = "feeds", type = "poll", priority = 5 }

[[schedules]]
name = "hourly"
cron = "@hourly"
template = { type = "hourly" }
"""


async def test_the_schedules_file_is_applied_at_every_start(
    jobq_servers: JobqServers, tmp_path: Path
) -> None:
    path = tmp_path / "schedules.toml"
    path.write_text(TOML_FILE, encoding="utf-8")
    server = await jobq_servers.start({"JOBQ_SCHEDULES": str(path)})
    async with httpx.AsyncClient(base_url=server.url) as client:
        listed = {s["name"]: s for s in (await client.get("/v1/schedules")).json()["schedules"]}
        assert sorted(listed) == ["nightly", "old", "poll"]
        assert {s["source"] for s in listed.values()} == {"file"}
        assert listed["nightly"]["template"]["payload"] == {"format": "pdf"}
        assert listed["nightly"]["catch_up"] == 1 and listed["poll"]["template"]["priority"] == 5
        assert (await client.post("/v1/schedules/poll/pause")).status_code == 200
        own = {"interval_seconds": 60, "template": {"type": "mine"}}
        assert (await client.put("/v1/schedules/mine", json=own)).status_code == 201
    server.send_signal(signal.SIGTERM)
    assert await server.wait_exit(15) == 0

    path.write_text(TOML_FILE_2, encoding="utf-8")
    server = await jobq_servers.start({"JOBQ_SCHEDULES": str(path)})
    async with httpx.AsyncClient(base_url=server.url) as client:
        now = {s["name"]: s for s in (await client.get("/v1/schedules")).json()["schedules"]}
    assert sorted(now) == ["hourly", "mine", "nightly", "poll"]  # old left the file: deleted
    assert now["nightly"]["next_run_at"] == listed["nightly"]["next_run_at"]
    assert now["nightly"]["updated_at"] == listed["nightly"]["updated_at"]  # untouched
    assert now["poll"]["interval_seconds"] == 600 and now["poll"]["paused"] is True
    assert now["hourly"]["source"] == "file" and now["mine"]["source"] == "api"
    log = server.log_text()
    assert "1 created, 1 updated, 1 unchanged, 1 deleted" in log, log


async def serve_with(database_url: str, schedules: Path) -> subprocess.CompletedProcess[str]:
    """Runs ``jobq serve`` with this schedules file until it exits (an unusable file: at once)."""
    return await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "app.cli", "serve", "--port", str(free_port())],
        cwd=REPO_ROOT,
        env=clean_environment({"DATABASE_URL": database_url, "JOBQ_SCHEDULES": str(schedules)}),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize(
    ("name", "content", "problem"),
    [
        (
            "bad.toml",
            TOML_FILE.replace('cron = "30 2 * * *"', 'cron = "30 2 * *"'),
            "schedules[0].cron: needs 5 fields",
        ),
        (
            "bad.json",
            '{"schedules": [{"name": "x", "cron": "* * * * *", "timezone": "Mars/Base",'
            ' "template": {"type": "t"}}]}',
            "schedules[0].timezone: unknown time zone",
        ),
        (
            "bad.json",
            '{"schedules": [{"name": "x", "interval_seconds": 5, "template": {"queue": "a b",'
            ' "type": "t"}}]}',
            "schedules[0].template.queue: ",
        ),
        (
            "bad.json",
            '{"schedules": [{"name": "x", "name": "y", "interval_seconds": 5,'
            ' "template": {"type": "t"}}]}',
            "schedules[0].name: ",
        ),
        ("dup.toml", TOML_FILE.replace('name = "poll"', 'name = "nightly"'), "given twice"),
        ("broken.toml", "[[schedules]\nname = 1", "not valid TOML"),
        ("schedules.yaml", "schedules: []", "must be a .toml or .json file"),
    ],
)
async def test_an_unusable_schedules_file_stops_the_start_with_one_line(
    tmp_path: Path, database_url: str, name: str, content: str, problem: str
) -> None:
    path = tmp_path / name
    path.write_text(content, encoding="utf-8")
    done = await serve_with(database_url, path)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"jobq: invalid JOBQ_SCHEDULES file {path}: "), lines[0]
    assert problem in lines[0], lines[0]
    assert done.stdout == ""


async def test_a_missing_file_stops_the_start_too(tmp_path: Path, database_url: str) -> None:
    missing = tmp_path / "nowhere.toml"
    done = await serve_with(database_url, missing)
    assert done.returncode == 2
    assert done.stderr.strip() == (
        f"jobq: invalid JOBQ_SCHEDULES file {missing}: cannot be read (No such file or directory)"
    )
