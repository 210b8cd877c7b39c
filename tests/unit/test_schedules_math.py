"""When schedules run (app/queue/schedules.py): validation, DST days in two zones, catch-up plans."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

import pytest

from app.domain.cron import (
    CATCH_UP_MAX,
    ScheduleError,
    Timing,
    cron_expression,
    cron_next_after,
    cron_prev_before,
    time_zone,
)

BERLIN = "Europe/Berlin"
NEW_YORK = "America/New_York"


def utc(
    year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0, us: int = 0
) -> datetime:
    return datetime(year, month, day, hour, minute, second, us, tzinfo=UTC)


def runs_between(timing: Timing, start: datetime, end: datetime) -> list[datetime]:
    """Every run in (start, end], walking forward."""
    assert timing.cron is not None
    found: list[datetime] = []
    at = start
    while True:
        at = cron_next_after(timing.cron, timing.zone, at)
        if at > end:
            return found
        found.append(at)


def local(instants: list[datetime], zone: str) -> list[str]:
    return [i.astimezone(time_zone(zone)).isoformat() for i in instants]


# -- validation ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "reason"),
    [
        ("61 * * * *", "not a valid cron expression"),
        ("* * * *", "needs 5 fields"),
        ("0 0 1 1 * 2030 x", "needs 5 fields"),
        (
            "0 0 1 1 * 2030",
            "not a valid",
        ),  # the year field is not taken: 6 fields are seconds first
        ("H * * * *", "hashed (H) and random (R)"),
        ("R 2 * * *", "hashed (H) and random (R)"),
        ("@reboot", "unknown alias"),
        ("0 0 30 2 *", "never matches"),
        ("0 0 31 4,6 *", "never matches"),
        ("*/0 * * * *", "not a valid"),
        ("0 0 * * m\u00f6n", "printable ASCII"),
        ("0 0\u00a0* * * *", "printable ASCII"),
        ("", "must not be empty"),
        ("   ", "must not be empty"),
        ("1" * 201, "at most 200"),
    ],
)
def test_unusable_cron_expressions_name_cron(expression: str, reason: str) -> None:
    with pytest.raises(ScheduleError) as caught:
        cron_expression(expression)
    assert caught.value.field == "cron"
    assert reason in caught.value.message


def test_cron_expressions_are_stored_normalised() -> None:
    assert cron_expression("  0   */2 * *  mon-fri ") == "0 */2 * * mon-fri"
    assert cron_expression("@Daily") == "@daily"
    assert cron_expression("*/15 * * * * *") == "*/15 * * * * *"
    assert cron_expression("0 0 L * *") == "0 0 L * *"


@pytest.mark.parametrize(
    "name",
    [
        "Mars/Olympus",
        "CEST",
        "../../etc/passwd",
        "/etc/localtime",
        "",
        # What only a host's zoneinfo directory holds, and the placeholder that is no place.
        "localtime",
        "posixrules",
        "posix/Europe/Berlin",
        "right/UTC",
        "Factory",
    ],
)
def test_unknown_time_zones_name_timezone(name: str) -> None:
    with pytest.raises(ScheduleError) as caught:
        Timing(cron="* * * * *", timezone=name)
    assert caught.value.field == "timezone"


@pytest.mark.parametrize("name", ["UTC", "Europe/Berlin", "America/New_York", "US/Eastern"])
def test_iana_zones_and_their_links_are_accepted(name: str) -> None:
    assert Timing(cron="* * * * *", timezone=name).timezone == name


def test_cron_or_interval_exactly() -> None:
    with pytest.raises(ScheduleError) as neither:
        Timing()
    assert neither.value.field == "cron"
    with pytest.raises(ScheduleError) as both:
        Timing(cron="* * * * *", interval_seconds=5)
    assert both.value.field == "interval_seconds"
    with pytest.raises(ScheduleError) as zero:
        Timing(interval_seconds=0)
    assert zero.value.field == "interval_seconds"


def test_six_fields_put_seconds_first() -> None:
    every_15s = Timing(cron="*/15 * * * * *")
    assert runs_between(every_15s, utc(2026, 1, 1, 0, 0, 0), utc(2026, 1, 1, 0, 1, 0)) == [
        utc(2026, 1, 1, 0, 0, 15),
        utc(2026, 1, 1, 0, 0, 30),
        utc(2026, 1, 1, 0, 0, 45),
        utc(2026, 1, 1, 0, 1, 0),
    ]
    # Second 0, minute 30, hour 2: the same as the five fields "30 2 * * *".
    assert runs_between(
        Timing(cron="0 30 2 * * *"), utc(2026, 1, 1), utc(2026, 1, 3)
    ) == runs_between(Timing(cron="30 2 * * *"), utc(2026, 1, 1), utc(2026, 1, 3))


# -- daylight saving time ----------------------------------------------------------------------

# Europe/Berlin 2026: clocks go from 02:00 to 03:00 on 29 March (01:00 UTC), and from 03:00 back
# to 02:00 on 25 October (01:00 UTC). America/New_York 2026: 02:00 -> 03:00 on 8 March (07:00
# UTC), 02:00 -> 01:00 on 1 November (06:00 UTC).


def test_a_daily_time_the_spring_gap_skips_runs_once_when_the_gap_ends() -> None:
    daily = Timing(cron="30 2 * * *", timezone=BERLIN)
    runs = runs_between(daily, utc(2026, 3, 27, 12), utc(2026, 3, 31, 12))
    assert local(runs, BERLIN) == [
        "2026-03-28T02:30:00+01:00",
        "2026-03-29T03:00:00+02:00",  # 02:30 does not exist: the first instant after the gap
        "2026-03-30T02:30:00+02:00",
        "2026-03-31T02:30:00+02:00",
    ]
    assert runs[1] == utc(2026, 3, 29, 1, 0)


def test_a_daily_time_the_autumn_repeats_runs_once_at_its_first_occurrence() -> None:
    daily = Timing(cron="30 2 * * *", timezone=BERLIN)
    runs = runs_between(daily, utc(2026, 10, 23, 12), utc(2026, 10, 27, 12))
    assert runs == [
        utc(2026, 10, 24, 0, 30),
        utc(2026, 10, 25, 0, 30),  # 02:30 CEST; the second 02:30 (CET, 01:30 UTC) is no run
        utc(2026, 10, 26, 1, 30),
        utc(2026, 10, 27, 1, 30),
    ]
    assert local(runs[1:2], BERLIN) == ["2026-10-25T02:30:00+02:00"]


def test_new_york_daily_runs_once_on_both_days() -> None:
    daily = Timing(cron="30 2 * * *", timezone=NEW_YORK)
    spring = runs_between(daily, utc(2026, 3, 7, 12), utc(2026, 3, 9, 12))
    assert local(spring, NEW_YORK) == ["2026-03-08T03:00:00-04:00", "2026-03-09T02:30:00-04:00"]
    repeated = Timing(cron="30 1 * * *", timezone=NEW_YORK)
    autumn = runs_between(repeated, utc(2026, 10, 31, 12), utc(2026, 11, 2, 12))
    assert autumn == [utc(2026, 11, 1, 5, 30), utc(2026, 11, 2, 6, 30)]  # 01:30 EDT, once


def test_hourly_runs_every_elapsed_hour_across_both_days() -> None:
    hourly = Timing(cron="0 * * * *", timezone=BERLIN)
    spring_day = runs_between(hourly, utc(2026, 3, 28, 22, 59), utc(2026, 3, 29, 21, 59))
    assert len(spring_day) == 23  # a 23-hour day, one run per hour
    assert local(spring_day[:4], BERLIN) == [
        "2026-03-29T00:00:00+01:00",
        "2026-03-29T01:00:00+01:00",
        "2026-03-29T03:00:00+02:00",  # 02:00 was skipped by the clock, and so is its run
        "2026-03-29T04:00:00+02:00",
    ]
    autumn_day = runs_between(hourly, utc(2026, 10, 24, 21, 59), utc(2026, 10, 25, 22, 59))
    assert len(autumn_day) == 25  # a 25-hour day
    assert local(autumn_day[1:5], BERLIN) == [
        "2026-10-25T01:00:00+02:00",
        "2026-10-25T02:00:00+02:00",
        "2026-10-25T02:00:00+01:00",  # the repeated hour runs again: it is another hour
        "2026-10-25T03:00:00+01:00",
    ]
    for day in (spring_day, autumn_day):
        assert all(b - a == timedelta(hours=1) for a, b in itertools.pairwise(day))


def test_every_five_minutes_never_bunches_or_pauses_in_a_zone_with_dst() -> None:
    for zone, start in (
        (NEW_YORK, utc(2026, 3, 8, 5)),
        (NEW_YORK, utc(2026, 11, 1, 4)),
        (BERLIN, utc(2026, 3, 28, 23)),
        (BERLIN, utc(2026, 10, 24, 23)),
    ):
        often = Timing(cron="*/5 * * * *", timezone=zone)
        runs = runs_between(often, start, start + timedelta(hours=4))
        assert len(runs) == 48
        assert all(b - a == timedelta(minutes=5) for a, b in itertools.pairwise(runs))


def test_fixed_hours_in_the_gap_merge_into_one_run() -> None:
    small_hours = Timing(cron="0 1-3 * * *", timezone=BERLIN)
    runs = runs_between(small_hours, utc(2026, 3, 28, 12), utc(2026, 3, 29, 12))
    # 01:00, then 02:00 (missing) and 03:00 are both 03:00 CEST: one run.
    assert local(runs, BERLIN) == ["2026-03-29T01:00:00+01:00", "2026-03-29T03:00:00+02:00"]
    autumn = runs_between(small_hours, utc(2026, 10, 24, 12), utc(2026, 10, 25, 12))
    assert local(autumn, BERLIN) == [
        "2026-10-25T01:00:00+02:00",
        "2026-10-25T02:00:00+02:00",
        "2026-10-25T03:00:00+01:00",
    ]


@pytest.mark.parametrize(
    ("expression", "zone", "start"),
    [
        ("30 2 * * *", BERLIN, utc(2026, 3, 25)),
        ("30 2 * * *", BERLIN, utc(2026, 10, 22)),
        ("0 * * * *", BERLIN, utc(2026, 10, 24, 18)),
        ("*/20 * * * *", NEW_YORK, utc(2026, 11, 1, 3)),
        ("50 1 * * *", NEW_YORK, utc(2026, 10, 29)),
        ("0 1-3 * * *", BERLIN, utc(2026, 3, 27)),
        ("*/30 * * * * *", NEW_YORK, utc(2026, 11, 1, 5, 58)),
        ("30 12 * * *", "Pacific/Apia", utc(2011, 12, 27)),  # 30 December 2011 never happened
    ],
)
def test_walking_back_meets_the_same_runs_as_walking_forward(
    expression: str, zone: str, start: datetime
) -> None:
    forward = [start]
    for _ in range(12):
        forward.append(cron_next_after(expression, time_zone(zone), forward[-1]))
    backward = [forward[-1]]
    for _ in range(12):
        previous = cron_prev_before(expression, time_zone(zone), backward[-1])
        assert previous is not None
        backward.append(previous)
    assert backward[:-1][::-1] == forward[1:]
    assert len(set(forward)) == len(forward)  # strictly increasing, no run twice


def test_searching_from_inside_the_repeated_hour() -> None:
    zone = time_zone(BERLIN)
    second_pass = utc(2026, 10, 25, 1, 10)  # 02:10 CET, the second 02:10 of the day
    # Fixed-time: 02:50 ran at its first occurrence (00:50 UTC); the next run is tomorrow's.
    assert cron_prev_before("50 2 * * *", zone, second_pass) == utc(2026, 10, 25, 0, 50)
    assert cron_next_after("50 2 * * *", zone, second_pass) == utc(2026, 10, 26, 1, 50)
    # Wildcard: the clock reads 02:10 again, so 02:50 comes again (01:50 UTC).
    assert cron_prev_before("50 * * * *", zone, second_pass) == utc(2026, 10, 25, 0, 50)
    assert cron_next_after("50 * * * *", zone, second_pass) == utc(2026, 10, 25, 1, 50)


# -- plans: what one scheduler pass enqueues ---------------------------------------------------


def test_a_pass_on_time_enqueues_the_current_run_only() -> None:
    minutely = Timing(cron="* * * * *")
    plan = minutely.plan(
        next_run_at=utc(2026, 5, 1, 12, 0), now=utc(2026, 5, 1, 12, 0, 0, 300), catch_up=0
    )
    assert plan.runs == (utc(2026, 5, 1, 12, 0),)
    assert plan.next_run_at == utc(2026, 5, 1, 12, 1)
    assert plan.skipped_from is None


def test_after_downtime_the_current_run_and_catch_up_missed_ones_are_enqueued() -> None:
    minutely = Timing(cron="* * * * *")
    plan = minutely.plan(
        next_run_at=utc(2026, 5, 1, 12, 0), now=utc(2026, 5, 1, 12, 9, 30), catch_up=3
    )
    assert plan.runs == tuple(utc(2026, 5, 1, 12, m) for m in (6, 7, 8, 9))
    assert plan.next_run_at == utc(2026, 5, 1, 12, 10)
    assert plan.skipped_from == utc(2026, 5, 1, 12, 0)  # 12:00 to 12:05 skipped
    none_missed = minutely.plan(
        next_run_at=utc(2026, 5, 1, 12, 7), now=utc(2026, 5, 1, 12, 9, 30), catch_up=3
    )
    assert none_missed.runs == tuple(utc(2026, 5, 1, 12, m) for m in (7, 8, 9))
    assert none_missed.skipped_from is None


def test_interval_plans_keep_their_phase() -> None:
    every_10s = Timing(interval_seconds=10)
    plan = every_10s.plan(
        next_run_at=utc(2026, 1, 1, 0, 0, 0), now=utc(2026, 1, 1, 0, 1, 5, 500_000), catch_up=2
    )
    assert plan.runs == (
        utc(2026, 1, 1, 0, 0, 40),
        utc(2026, 1, 1, 0, 0, 50),
        utc(2026, 1, 1, 0, 1),
    )
    assert plan.next_run_at == utc(2026, 1, 1, 0, 1, 10)
    assert plan.skipped_from == utc(2026, 1, 1, 0, 0, 0)
    early = every_10s.plan(
        next_run_at=utc(2026, 1, 1, 0, 2), now=utc(2026, 1, 1, 0, 1, 5), catch_up=2
    )
    assert early.runs == () and early.next_run_at == utc(2026, 1, 1, 0, 2)


def test_catch_up_across_the_autumn_change_counts_real_runs() -> None:
    hourly = Timing(cron="0 * * * *", timezone=BERLIN)
    plan = hourly.plan(
        next_run_at=utc(2026, 10, 24, 22), now=utc(2026, 10, 25, 3, 30), catch_up=CATCH_UP_MAX
    )
    assert plan.runs == tuple(utc(2026, 10, 24, 22) + timedelta(hours=h) for h in range(6))
    assert plan.next_run_at == utc(2026, 10, 25, 4)


def test_first_runs_and_resumes() -> None:
    now = utc(2026, 6, 1, 8, 15, 42, 999_999)
    assert Timing(interval_seconds=60).first_run(now) == utc(2026, 6, 1, 8, 16, 42)
    assert Timing(cron="0 9 * * *", timezone=BERLIN).first_run(now) == utc(2026, 6, 2, 7)
    every_hour = Timing(interval_seconds=3600)
    # Resumed at 08:15:42 after a pause that began before 06:00: next on the 00-minute grid.
    assert every_hour.resumed_run(utc(2026, 6, 1, 6), now) == utc(2026, 6, 1, 9)
    assert every_hour.resumed_run(utc(2026, 6, 1, 10), now) == utc(2026, 6, 1, 10)
    assert Timing(cron="*/10 * * * *").resumed_run(utc(2026, 5, 1), now) == utc(2026, 6, 1, 8, 20)
