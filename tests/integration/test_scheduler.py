"""The scheduler's pass on real PostgreSQL: each run once, catch-up, DST days, concurrent passes.

Passes run through the loop's ``run_once(now=...)`` (or the service method) with an exact clock;
the schedules' ``next_run_at`` is set by hand where a test needs the past.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.domain.cron import JobTemplate, ScheduleSpec, Timing
from app.maintenance.runner import drain
from app.maintenance.scheduler import Scheduler, SchedulerConfig
from app.queue.services import Services
from tests.integration.helpers import db_now
from tests.integration.helpers import service as make_service
from tests.polling import poll_until

BERLIN = "Europe/Berlin"


@pytest.fixture(autouse=True)
async def no_schedules_left(clean_db: AsyncEngine) -> AsyncIterator[None]:
    """No schedule outlives the test (a later test's server would run it)."""
    yield
    async with clean_db.begin() as conn:
        await conn.execute(text("TRUNCATE schedules"))


def utc(
    year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0
) -> datetime:
    return datetime(year, month, day, hour, minute, second, tzinfo=UTC)


def spec(
    *,
    cron: str | None = None,
    interval_seconds: int | None = None,
    timezone: str = "UTC",
    queue: str = "periodic",
    catch_up: int = 0,
    **template: Any,
) -> ScheduleSpec:
    return ScheduleSpec(
        timing=Timing(cron=cron, interval_seconds=interval_seconds, timezone=timezone),
        template=JobTemplate(queue=queue, type=template.pop("type", "tick"), **template),
        catch_up=catch_up,
    )


async def set_next_run(engine: AsyncEngine, name: str, at: datetime) -> None:
    async with engine.begin() as conn:
        await conn.execute(
            text("UPDATE schedules SET next_run_at = :at WHERE name = :name"),
            {"at": at, "name": name},
        )


async def schedule_row(engine: AsyncEngine, name: str) -> dict[str, Any]:
    async with engine.connect() as conn:
        result = await conn.execute(text("SELECT * FROM schedules WHERE name = :n"), {"n": name})
        return dict(result.mappings().one())


async def scheduled_jobs(engine: AsyncEngine) -> list[dict[str, Any]]:
    """The jobs the scheduler enqueued (marked with their run), by due time."""
    async with engine.connect() as conn:
        result = await conn.execute(
            text(
                "SELECT id, queue, type, payload, priority, status, run_at, idempotency_key, "
                "max_attempts, lease_seconds, concurrency_key, schedule_name, scheduled_for "
                "FROM jobs WHERE schedule_name IS NOT NULL ORDER BY run_at, id"
            )
        )
        return [dict(r) for r in result.mappings()]


def run_of(name: str, instant: datetime) -> tuple[str, datetime]:
    """A run as its job is marked: the schedule's name and the run's instant."""
    return (name, instant)


def keys(jobs: Sequence[dict[str, Any]]) -> list[tuple[str, datetime]]:
    return [(j["schedule_name"], j["scheduled_for"]) for j in jobs]


async def test_a_due_run_is_enqueued_once_marked_with_its_instant(
    clean_db: AsyncEngine, svc: Services
) -> None:
    await svc.schedules.put(
        "report",
        spec(interval_seconds=60, payload={"kind": "daily"}, priority=5, max_attempts=3),
    )
    due = (await db_now(clean_db)).replace(microsecond=0) - timedelta(seconds=10)
    await set_next_run(clean_db, "report", due)
    scheduler = Scheduler(services=svc, config=SchedulerConfig())

    assert (await scheduler.run_once(now=due - timedelta(microseconds=1))).schedules == 0
    outcome = await scheduler.run_once(now=due)
    assert (outcome.schedules, outcome.enqueued, outcome.skipped) == (1, 1, ())
    [job] = await scheduled_jobs(clean_db)
    assert keys([job]) == [run_of("report", due)]
    assert job["idempotency_key"] is None  # the producers' namespace is theirs alone
    assert (job["queue"], job["type"], job["payload"], job["priority"]) == (
        "periodic",
        "tick",
        {"kind": "daily"},
        5,
    )
    assert job["run_at"] == due and job["status"] == "pending"
    assert job["max_attempts"] == 3 and job["lease_seconds"] == 30  # the service's default
    row = await schedule_row(clean_db, "report")
    assert row["next_run_at"] == due + timedelta(seconds=60)
    assert row["last_run_at"] == due and row["last_job_id"] == job["id"]
    # Nothing is due again until the next run.
    assert (await scheduler.run_once(now=due + timedelta(seconds=59))).schedules == 0
    assert len(await scheduled_jobs(clean_db)) == 1


async def test_after_downtime_exactly_catch_up_missed_runs_and_the_current_one(
    clean_db: AsyncEngine, svc: Services
) -> None:
    await svc.schedules.put("every10", spec(interval_seconds=10, catch_up=3))
    await svc.schedules.put("minutely", spec(cron="* * * * *", catch_up=2, queue="other"))
    base = utc(2026, 11, 30, 12, 0, 0)
    await set_next_run(clean_db, "every10", base)
    await set_next_run(clean_db, "minutely", base)
    now = base + timedelta(minutes=9, seconds=35)  # 58 interval runs and 10 minutes missed

    outcome = await svc.schedules.enqueue_runs(batch_size=10, now=now)
    assert outcome.schedules == 2 and outcome.enqueued == 4 + 3
    every10 = [j for j in await scheduled_jobs(clean_db) if j["queue"] == "periodic"]
    assert [j["run_at"] for j in every10] == [
        base + timedelta(minutes=9, seconds=s) for s in (0, 10, 20, 30)
    ]
    minutely = [j for j in await scheduled_jobs(clean_db) if j["queue"] == "other"]
    assert [j["run_at"] for j in minutely] == [base + timedelta(minutes=m) for m in (7, 8, 9)]
    assert (await schedule_row(clean_db, "every10"))["next_run_at"] == now + timedelta(seconds=5)
    assert (await schedule_row(clean_db, "minutely"))["next_run_at"] == base + timedelta(minutes=10)
    skipped = {s.name: (s.since, s.until) for s in outcome.skipped}
    assert skipped == {
        "every10": (base, base + timedelta(minutes=9)),
        "minutely": (base, base + timedelta(minutes=7)),
    }


async def test_a_stale_pass_finds_the_runs_taken_and_doubles_nothing(
    clean_db: AsyncEngine, svc: Services
) -> None:
    """A second leader that read the schedule before the first one moved it: the marks decide."""
    await svc.schedules.put("tick", spec(interval_seconds=5, catch_up=10))
    base = utc(2026, 11, 30, 8, 0, 0)
    await set_next_run(clean_db, "tick", base)
    now = base + timedelta(seconds=12)
    first = await svc.schedules.enqueue_runs(batch_size=10, now=now)
    assert first.enqueued == 3
    [*_, current] = await scheduled_jobs(clean_db)
    await set_next_run(clean_db, "tick", base)  # as the stale leader saw it

    again = await svc.schedules.enqueue_runs(batch_size=10, now=now)
    assert again.schedules == 1 and again.enqueued == 0
    assert keys(await scheduled_jobs(clean_db)) == [
        run_of("tick", base + timedelta(seconds=s)) for s in (0, 5, 10)
    ]
    row = await schedule_row(clean_db, "tick")
    assert row["next_run_at"] == base + timedelta(seconds=15)
    assert row["last_job_id"] == current["id"]  # the existing job of the current run


async def test_passes_running_at_once_double_nothing(
    clean_db: AsyncEngine, driver_pool: Any
) -> None:
    """Two services (two instances that both lead) run passes at once over the same schedules."""
    one, two = make_service(clean_db, driver_pool), make_service(clean_db, driver_pool)
    base = utc(2026, 11, 30, 9, 0, 0)
    names = [f"s{i:02d}" for i in range(40)]
    for i, name in enumerate(names):
        await one.schedules.put(name, spec(interval_seconds=1 + i % 3, catch_up=5))
        await set_next_run(clean_db, name, base)
    now = base + timedelta(seconds=4)

    async def passes(service: Services) -> int:
        handled = 0
        while True:
            outcome = await service.schedules.enqueue_runs(batch_size=3, now=now)
            handled += outcome.schedules
            if outcome.schedules == 0:
                return handled

    handled = await asyncio.gather(passes(one), passes(two), passes(one), passes(two))
    assert sum(handled) == len(names)  # each schedule moved by exactly one pass
    jobs = await scheduled_jobs(clean_db)
    assert len(keys(jobs)) == len(set(keys(jobs)))
    expected = []
    for i, name in enumerate(names):
        step = 1 + i % 3
        expected += [
            run_of(name, base + timedelta(seconds=s)) for s in range(0, 5) if s % step == 0
        ]
    assert sorted(keys(jobs)) == sorted(expected)
    assert (await one.schedules.enqueue_runs(batch_size=100, now=now)).schedules == 0


async def test_batches_are_bounded_and_drain(clean_db: AsyncEngine, svc: Services) -> None:
    for i in range(25):
        await svc.schedules.put(f"b{i}", spec(interval_seconds=3600))
    async with clean_db.begin() as conn:
        await conn.execute(text("UPDATE schedules SET next_run_at = now() - interval '1 second'"))
    scheduler = Scheduler(services=svc, config=SchedulerConfig(batch_size=10))
    assert await scheduler.run_batch() == 10
    assert await drain(scheduler) == 15
    assert len(await scheduled_jobs(clean_db)) == 25


async def test_paused_schedules_enqueue_nothing_and_resume_from_now(
    clean_db: AsyncEngine, svc: Services
) -> None:
    await svc.schedules.put("p", spec(cron="* * * * * *", catch_up=100))
    await svc.schedules.set_paused("p", paused=True)
    stopped_at = (await schedule_row(clean_db, "p"))["next_run_at"]
    await set_next_run(clean_db, "p", stopped_at - timedelta(seconds=30))
    assert (await svc.schedules.enqueue_runs(batch_size=10)).schedules == 0

    resumed = await svc.schedules.set_paused("p", paused=False)
    now = await db_now(clean_db)
    assert not resumed.paused
    assert now < resumed.next_run_at <= now + timedelta(seconds=1)  # not the paused stretch
    outcome = await svc.schedules.enqueue_runs(batch_size=10, now=resumed.next_run_at)
    assert outcome.enqueued == 1  # the first run after the resume; nothing of the pause


async def test_replacing_a_definition_keeps_its_next_run_unless_the_timing_changes(
    clean_db: AsyncEngine, svc: Services
) -> None:
    _, created = await svc.schedules.put("r", spec(cron="0 3 * * *", timezone=BERLIN))
    assert created
    await set_next_run(clean_db, "r", utc(2026, 11, 29, 2))  # missed, to be caught up
    row, created = await svc.schedules.put("r", spec(cron="0 3 * * *", timezone=BERLIN, priority=9))
    assert not created and row.priority == 9 and row.next_run_at == utc(2026, 11, 29, 2)
    row, _ = await svc.schedules.put("r", spec(cron="0 4 * * *", timezone=BERLIN))
    assert row.next_run_at > await db_now(clean_db)
    assert row.next_run_at.astimezone(Timing(cron="0 4 * * *", timezone=BERLIN).zone).hour == 4


async def test_enqueued_runs_wake_a_waiting_claim(clean_db: AsyncEngine, svc: Services) -> None:
    await svc.schedules.put("wake", spec(interval_seconds=3600, queue="wakeq"))
    await set_next_run(clean_db, "wake", (await db_now(clean_db)) - timedelta(seconds=1))
    claim = asyncio.create_task(
        svc.jobs.claim(
            worker_id="w", queues=["wakeq"], max_jobs=1, lease_seconds=30, wait_seconds=20
        )
    )
    await poll_until(lambda: bool(svc.jobs.hub.parked), within=5, what="the claim to park")
    assert (await svc.schedules.enqueue_runs(batch_size=10)).enqueued == 1
    # No backstop runs here: only the announcement can wake the claim before its 20 s.
    [job] = await asyncio.wait_for(claim, timeout=5)
    assert job.schedule_name == "wake"


# -- daylight saving time, through the pass ----------------------------------------------------


async def pass_at(svc: Services, now: datetime) -> list[str]:
    """Runs one pass at ``now``; answers the due times of the jobs it enqueued (UTC, ISO)."""
    engine: AsyncEngine = svc.unit.engine
    before = set(keys(await scheduled_jobs(engine)))
    await svc.schedules.enqueue_runs(batch_size=10, now=now)
    return [
        f"{j['run_at']:%Y-%m-%dT%H:%M:%SZ}"
        for j in await scheduled_jobs(engine)
        if (j["schedule_name"], j["scheduled_for"]) not in before
    ]


@pytest.mark.parametrize(
    ("day", "due", "then"),
    [
        # Spring: 02:30 does not exist on 29 March; the run is at 03:00 CEST (01:00 UTC).
        (utc(2026, 3, 29), utc(2026, 3, 29, 1, 0), utc(2026, 3, 30, 0, 30)),
        # Autumn: 02:30 happens twice on 25 October; the run is at the first (00:30 UTC).
        (utc(2026, 10, 25), utc(2026, 10, 25, 0, 30), utc(2026, 10, 26, 1, 30)),
    ],
)
async def test_a_nightly_berlin_job_runs_once_on_each_dst_day(
    clean_db: AsyncEngine, svc: Services, day: datetime, due: datetime, then: datetime
) -> None:
    await svc.schedules.put("nightly", spec(cron="30 2 * * *", timezone=BERLIN, catch_up=5))
    await set_next_run(clean_db, "nightly", due)
    assert await pass_at(svc, due - timedelta(seconds=1)) == []
    assert await pass_at(svc, due) == [f"{due:%Y-%m-%dT%H:%M:%SZ}"]
    assert (await schedule_row(clean_db, "nightly"))["next_run_at"] == then
    # Every moment up to the next night's run, the second 02:30 included: nothing more.
    for hours in (1, 2, 6, 12):
        assert (
            await pass_at(svc, min(due + timedelta(hours=hours), then - timedelta(seconds=1))) == []
        )
    assert await pass_at(svc, then) == [f"{then:%Y-%m-%dT%H:%M:%SZ}"]


async def test_an_hourly_berlin_job_runs_every_real_hour_across_both_dst_days(
    clean_db: AsyncEngine, svc: Services
) -> None:
    await svc.schedules.put("hourly", spec(cron="0 * * * *", timezone=BERLIN, catch_up=100))
    for start, end, hours in (
        (utc(2026, 3, 28, 23), utc(2026, 3, 29, 22), 23),  # local midnight to midnight
        (utc(2026, 10, 24, 22), utc(2026, 10, 25, 23), 25),
    ):
        await set_next_run(clean_db, "hourly", start)
        enqueued = []
        at = start
        while at < end:  # a pass every 20 minutes through the local day
            enqueued += await pass_at(svc, at)
            at += timedelta(minutes=20)
        assert enqueued == [
            f"{start + timedelta(hours=h):%Y-%m-%dT%H:%M:%SZ}" for h in range(hours)
        ]
