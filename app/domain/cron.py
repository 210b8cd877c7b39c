"""When a periodic schedule runs: cron expressions and intervals in a time zone (pure, no I/O).

A schedule is a cron expression or an interval, in an IANA time zone (UTC by default).

**Cron expressions** are croniter's syntax (ranges, steps, names, ``L``, ``W``, ``#``; when
both day of month and day of week are restricted, either matching is enough, as in Vixie
cron), with 5 fields, 6 with seconds first, or an alias (``@hourly`` ... ``@yearly``). They are
read on the clock of the zone. croniter only does calendar arithmetic on naive wall times here;
turning wall times into instants across daylight-saving changes follows Vixie cron's rule,
which tells two kinds of expression apart:

- *Fixed-time* expressions name their seconds (if any), minute and hour (none of those fields
  starts with ``*``: ``30 2 * * *``, ``0 9,17 * * 1-5``). Every local time they match runs
  exactly once (:func:`wall_instant`): a time that happens twice (clocks go back) runs at its
  first occurrence only; a time that does not exist (clocks go forward) runs at the first
  instant after the gap (03:00 local for 02:30 on the day Europe/Berlin springs forward), and
  the times of one gap make one run there. A daily job runs once on each DST day.
- *Wildcard* expressions (a seconds, minute or hour field starting with ``*``: ``*/5 * * * *``,
  ``0 * * * *``, ``@hourly``) follow the clock as it reads at each instant: in the repeated hour
  their times run at both occurrences, and times in the skipped hour do not run. An hourly job
  runs every elapsed hour: 23 times on the spring day, 25 on the autumn day; ``*/5`` never
  pauses or bunches up.

croniter's own handling of zone-aware datetimes is not used: it moves a missing daily time to
the end of the gap but skips a missing hourly one, and runs a repeated daily time twice.

**Intervals** are elapsed time, whatever the zone: runs at ``next_run_at + k * interval``.
A new interval schedule first runs one interval after it is made (in whole seconds).

Every run instant is a whole second, so a run is named exactly by its schedule and instant (the
``schedule_name`` / ``scheduled_for`` mark of its job).

**Time zones** are the names the ``tzdata`` package lists (a dependency, so every instance of a
release accepts the same names): canonical zones such as ``Europe/Berlin`` and ``UTC``, and the
IANA links to them (``US/Eastern``, ``Asia/Calcutta``), which stand for the same rules. Refused:
``Factory`` (a placeholder that is no place's time), and whatever only a host's own zoneinfo
directory holds (``localtime``, which is the host's setting, ``posixrules``, ``posix/...``,
``right/...``), since another instance would read such a schedule differently or not at all.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, tzinfo
from importlib import resources
from zoneinfo import ZoneInfo

from croniter import CroniterBadDateError, CroniterError, croniter

# What the storage holds (migration 0013's checks); policy limits below these are settings.
SCHEDULE_NAME_MAX_CHARS = 128
SCHEDULE_NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$")
CRON_MAX_CHARS = 200
TIMEZONE_MAX_CHARS = 64
INTERVAL_SECONDS_MAX = 366 * 24 * 3600
CATCH_UP_MAX = 1000
DEFAULT_TIMEZONE = "UTC"
SOURCES = ("api", "file")

# The aliases croniter knows, as their 5-field expressions (@reboot has no meaning here).
CRON_ALIASES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_FIELD_SEPARATOR = re.compile(r"[ \t]+")
# croniter's hashed (H) and random (R) fields: the first needs an id, the second would give
# another schedule each time the expression is read.
_HASHED_FIELD = re.compile(r"^[hr](\(\d+-\d+\))?(/\d+)?$", re.IGNORECASE)
# Any start works for checking that an expression ever matches (croniter looks 50 years ahead).
_PROBE_START = datetime(2000, 1, 1)
_SECOND = timedelta(seconds=1)
_MICROSECOND = timedelta(microseconds=1)


class ScheduleError(ValueError):
    """A schedule definition that cannot be used; ``field`` names the part (cron, timezone, ...)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


def cron_fields(expression: str) -> list[str]:
    """The fields of a cron expression (an alias stands for its five); ``ScheduleError`` if unusable."""
    text = expression.strip()
    if not text:
        raise ScheduleError("cron", "must not be empty")
    if len(text) > CRON_MAX_CHARS:
        raise ScheduleError("cron", f"must be at most {CRON_MAX_CHARS} characters")
    if not text.isascii() or not text.replace("\t", " ").isprintable():
        raise ScheduleError("cron", "must be printable ASCII")
    if text.startswith("@"):
        alias = CRON_ALIASES.get(text.lower())
        if alias is None:
            known = ", ".join(sorted(CRON_ALIASES))
            raise ScheduleError("cron", f"unknown alias {text!r}; known: {known}")
        text = alias
    fields = _FIELD_SEPARATOR.split(text)
    if len(fields) not in (5, 6):
        raise ScheduleError(
            "cron",
            f"needs 5 fields (minute hour day-of-month month day-of-week) or 6 with seconds "
            f"first, got {len(fields)}",
        )
    if any(_HASHED_FIELD.match(f) for f in fields):
        raise ScheduleError("cron", "hashed (H) and random (R) fields are not supported")
    return fields


def cron_expression(expression: str) -> str:
    """A valid cron expression as stored (fields joined by one space, aliases in lower case).

    Refused with ``ScheduleError`` naming ``cron``: anything croniter does not parse, a number
    of fields other than 5 or 6, hashed or random fields, and an expression that never matches
    (``0 0 30 2 *``).
    """
    text = expression.strip()
    fields = cron_fields(text)
    stored = text.lower() if text.startswith("@") else " ".join(fields)
    try:
        _croniter(" ".join(fields), _PROBE_START).get_next(datetime)
    except CroniterBadDateError:
        raise ScheduleError("cron", "never matches a date (e.g. the 30th of February)") from None
    except (CroniterError, ValueError, TypeError, KeyError, IndexError) as exc:
        # croniter's messages quote the expression; keep ours short and about the value.
        raise ScheduleError(
            "cron", f"not a valid cron expression ({_croniter_reason(exc)})"
        ) from None
    return stored


def _croniter_reason(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return text[:120]


def _croniter(expression: str, start: datetime) -> croniter:
    return croniter(expression, start, ret_type=datetime, second_at_beginning=True)


# Names of the IANA database that are no place's time: a schedule in them would run on no clock.
_NOT_PLACES = frozenset({"Factory"})


@functools.cache
def zone_names() -> frozenset[str]:
    """The time zone names a schedule may use (see the module's rules)."""
    listed = resources.files("tzdata").joinpath("zones").read_text(encoding="utf-8")
    return frozenset(listed.split()) - _NOT_PLACES


@functools.cache
def time_zone(name: str) -> ZoneInfo:
    """The IANA zone of this name; ``ScheduleError`` naming ``timezone`` for any other.

    Only the names of :func:`zone_names` count (``Europe/Berlin``, ``America/New_York``,
    ``UTC``); ``localtime``, ``Factory``, ``posix/...``, file paths and abbreviations like
    ``CEST`` are refused. The rules come from the system's zoneinfo, else the ``tzdata`` package.
    """
    if not name or len(name) > TIMEZONE_MAX_CHARS or name not in zone_names():
        raise ScheduleError(
            "timezone",
            f"unknown time zone {name[:TIMEZONE_MAX_CHARS]!r}; use an IANA zone name "
            "(Europe/Berlin, UTC)",
        )
    return ZoneInfo(name)


def _utc_seconds(instant: datetime) -> datetime:
    return instant.astimezone(UTC).replace(microsecond=0)


def _offset_at(timestamp: int, zone: tzinfo) -> timedelta | None:
    return datetime.fromtimestamp(timestamp, zone).utcoffset()


def wall_instant(wall: datetime, zone: tzinfo) -> datetime:
    """The instant (UTC) a naive wall time of ``zone`` runs at (see the module's rules).

    Once: that instant. Twice (clocks went back): the first occurrence. Never (clocks went
    forward past it): the first instant after the gap, found by bisecting the gap's seconds
    for the change of offset.
    """
    first = wall.replace(tzinfo=zone, fold=0).astimezone(UTC)
    second = wall.replace(tzinfo=zone, fold=1).astimezone(UTC)
    if first == second:
        return first
    earlier, later = sorted((first, second))
    if earlier.astimezone(zone).replace(tzinfo=None) == wall:
        return earlier  # it exists twice: the first occurrence
    # In a gap each fold reads the wall time with the offset of one side of the change, so the
    # change lies between the two readings: find its second.
    low, high = int(earlier.timestamp()), int(later.timestamp())
    after = _offset_at(high, zone)
    while high - low > 1:
        middle = (low + high) // 2
        if _offset_at(middle, zone) == after:
            high = middle
        else:
            low = middle
    return datetime.fromtimestamp(high, UTC)


def _walls(expression: str, start: datetime, *, backwards: bool) -> Iterator[datetime]:
    """Naive wall times the expression matches, strictly after (or before) ``start``."""
    it = _croniter(expression, start)
    while True:
        try:
            wall: datetime = it.get_prev(datetime) if backwards else it.get_next(datetime)
        except CroniterBadDateError:
            return
        yield wall


def is_fixed_time(fields: list[str]) -> bool:
    """Whether an expression names its seconds, minute and hour (none starts with ``*``)."""
    clock = fields[:3] if len(fields) == 6 else fields[:2]
    return not any(f.startswith("*") for f in clock)


def cron_next_after(expression: str, zone: tzinfo, instant: datetime) -> datetime:
    """The first run of the cron expression strictly after ``instant`` (UTC)."""
    fields = cron_fields(expression)
    if is_fixed_time(fields):
        return _fixed_next(" ".join(fields), zone, instant)
    return _clock_next(" ".join(fields), zone, instant)


def cron_prev_before(expression: str, zone: tzinfo, instant: datetime) -> datetime | None:
    """The last run of the cron expression strictly before ``instant`` (UTC); ``None`` if none."""
    fields = cron_fields(expression)
    if is_fixed_time(fields):
        return _fixed_prev(" ".join(fields), zone, instant)
    return _clock_prev(" ".join(fields), zone, instant)


def _fixed_next(expression: str, zone: tzinfo, instant: datetime) -> datetime:
    local = instant.astimezone(zone)
    for wall in _walls(expression, local.replace(tzinfo=None, fold=0), backwards=False):
        # Wall times later than the instant's own may still lie before it: those of a repeated
        # stretch whose first occurrence has passed, while the instant is in the second one.
        run = wall_instant(wall, zone)
        if run > instant:
            return run
    raise ScheduleError("cron", "has no run after " + instant.isoformat())


def _fixed_prev(expression: str, zone: tzinfo, instant: datetime) -> datetime | None:
    local = instant.astimezone(zone)
    start = local.replace(tzinfo=None, fold=0)
    if local.fold:
        # The instant is in the second pass of a repeated stretch: every wall time of that
        # stretch had its (first) occurrence before it, up to where the stretch ends.
        repeated, current = local.replace(fold=0).utcoffset(), local.utcoffset()
        if repeated is not None and current is not None:
            start += repeated - current
    for wall in _walls(expression, start + _SECOND, backwards=True):
        run = wall_instant(wall, zone)
        if run < instant:
            return run
    return None


# Wildcard expressions: within a stretch of one UTC offset, the clock reads instant + offset, so
# the runs there are the matching wall times minus that offset. A candidate found with one
# offset counts only if no offset change lies between it and where the search began; otherwise
# the search goes on from the change with the new offset. Offset changes are found by scanning
# in steps (tzdata never changes a zone's offset twice within one) and bisecting the seconds.
_SCAN_STEP = timedelta(hours=3)


def _offset(instant: datetime, zone: tzinfo) -> timedelta:
    offset = instant.astimezone(zone).utcoffset()
    return offset if offset is not None else timedelta(0)


def _reading(instant: datetime, offset: timedelta) -> datetime:
    """The naive wall time a clock at ``offset`` shows at ``instant``."""
    return (instant.astimezone(UTC) + offset).replace(tzinfo=None)


def _at(wall: datetime, offset: timedelta) -> datetime:
    """The instant a clock at ``offset`` shows the naive ``wall`` time."""
    return wall.replace(tzinfo=UTC) - offset


def _first_change(zone: tzinfo, low: datetime, high: datetime) -> datetime:
    """The first whole second in (low, high] whose offset differs from ``low``'s (there is one)."""
    base = _offset(low, zone)
    lo, hi = math.floor(low.timestamp()), math.ceil(high.timestamp())
    while hi - lo > 1:
        middle = (lo + hi) // 2
        if _offset_at(middle, zone) == base:
            lo = middle
        else:
            hi = middle
    return datetime.fromtimestamp(hi, UTC)


def _change_after(zone: tzinfo, start: datetime, until: datetime) -> datetime | None:
    """The first instant in (start, until] with another offset than ``start``'s, if any."""
    base, low = _offset(start, zone), start
    while low < until:
        high = min(low + _SCAN_STEP, until)
        if _offset(high, zone) != base:
            return _first_change(zone, low, high)
        low = high
    return None


def _stretch_start(zone: tzinfo, end: datetime, since: datetime) -> datetime | None:
    """Where the offset in force just before ``end`` began, if that is after ``since``."""
    base, high = _offset(end - _MICROSECOND, zone), end - _MICROSECOND
    while high > since:
        low = max(high - _SCAN_STEP, since)
        if _offset(low, zone) != base:
            return _first_change(zone, low, high)
        high = low
    return None


def _clock_next(expression: str, zone: tzinfo, instant: datetime) -> datetime:
    start = instant
    while True:
        offset = _offset(start, zone)
        run = None
        # From the clock's reading at ``start`` on, that reading included (after an offset
        # change, a run may fall on the change itself).
        for wall in _walls(expression, _reading(start, offset) - _MICROSECOND, backwards=False):
            candidate = _at(wall, offset)
            if candidate > instant:
                run = candidate
                break
        if run is None:
            raise ScheduleError("cron", "has no run after " + instant.isoformat())
        change = _change_after(zone, start, run)
        if change is None:
            return run
        start = change


def _clock_prev(expression: str, zone: tzinfo, instant: datetime) -> datetime | None:
    end = instant
    while True:
        offset = _offset(end - _MICROSECOND, zone)
        walls = _walls(expression, _reading(end, offset), backwards=True)
        wall = next(walls, None)
        if wall is None:
            return None
        run = _at(wall, offset)
        began = _stretch_start(zone, end, run)
        if began is None:
            return run
        end = began


@dataclass(frozen=True)
class Timing:
    """When a schedule runs: a cron expression or an interval in seconds, and a time zone.

    Constructed valid or not at all: ``ScheduleError`` names ``cron``, ``interval_seconds`` or
    ``timezone``.
    """

    cron: str | None = None
    interval_seconds: int | None = None
    timezone: str = DEFAULT_TIMEZONE

    def __post_init__(self) -> None:
        if (self.cron is None) == (self.interval_seconds is None):
            raise ScheduleError(
                "interval_seconds" if self.cron is not None else "cron",
                "give either cron or interval_seconds, not both"
                if self.cron is not None
                else "give either cron or interval_seconds",
            )
        if self.cron is not None:
            object.__setattr__(self, "cron", cron_expression(self.cron))
        if self.interval_seconds is not None and not (
            1 <= self.interval_seconds <= INTERVAL_SECONDS_MAX
        ):
            raise ScheduleError(
                "interval_seconds", f"must be within 1..{INTERVAL_SECONDS_MAX} (366 days)"
            )
        time_zone(self.timezone)

    @property
    def zone(self) -> ZoneInfo:
        """The time zone."""
        return time_zone(self.timezone)

    @property
    def _interval(self) -> timedelta:
        if self.interval_seconds is None:
            raise TypeError("not an interval schedule")
        return timedelta(seconds=self.interval_seconds)

    def first_run(self, now: datetime) -> datetime:
        """The first run of a schedule made (or re-timed) at ``now``: strictly after it."""
        if self.cron is not None:
            return cron_next_after(self.cron, self.zone, now)
        return _utc_seconds(now) + self._interval

    def resumed_run(self, next_run_at: datetime, now: datetime) -> datetime:
        """The next run of a schedule resumed at ``now``: its first run after ``now``.

        Runs that came due while it was paused are not caught up. An interval schedule keeps
        its phase (the next ``next_run_at + k * interval`` after ``now``).
        """
        if self.cron is not None:
            return cron_next_after(self.cron, self.zone, now)
        if next_run_at > now:
            return next_run_at
        return next_run_at + ((now - next_run_at) // self._interval + 1) * self._interval

    def plan(self, *, next_run_at: datetime, now: datetime, catch_up: int) -> RunPlan:
        """What the scheduler enqueues at ``now`` for a schedule whose next run was ``next_run_at``.

        The due runs are the runs in [next_run_at, now]. The latest of them is the current
        run; the others were missed. The plan enqueues the current run and the ``catch_up``
        latest missed ones, oldest first; older missed runs are skipped. The next run is the
        first one strictly after ``now``.
        """
        if not 0 <= catch_up <= CATCH_UP_MAX:
            raise ValueError(f"catch_up must be within 0..{CATCH_UP_MAX}")
        if self.cron is None:
            return self._plan_interval(next_run_at, now, catch_up)
        zone = self.zone
        runs: list[datetime] = []
        run = cron_prev_before(self.cron, zone, now + _MICROSECOND)
        while run is not None and run >= next_run_at and len(runs) <= catch_up:
            runs.append(run)
            run = cron_prev_before(self.cron, zone, run)
        runs.reverse()
        skipped = run is not None and run >= next_run_at
        return RunPlan(
            runs=tuple(runs),
            next_run_at=cron_next_after(self.cron, zone, now),
            skipped_from=next_run_at if skipped else None,
        )

    def _plan_interval(self, next_run_at: datetime, now: datetime, catch_up: int) -> RunPlan:
        interval = self._interval
        if next_run_at > now:
            return RunPlan(runs=(), next_run_at=next_run_at, skipped_from=None)
        latest = (now - next_run_at) // interval
        first = max(0, latest - catch_up)
        return RunPlan(
            runs=tuple(next_run_at + k * interval for k in range(first, latest + 1)),
            next_run_at=next_run_at + (latest + 1) * interval,
            skipped_from=next_run_at if first > 0 else None,
        )


@dataclass(frozen=True)
class RunPlan:
    """The runs one scheduler pass enqueues for a schedule, and where the schedule goes next."""

    runs: tuple[datetime, ...]  # oldest first; the last is the current run
    next_run_at: datetime
    # Runs due from this instant up to (not including) the first of ``runs`` were skipped
    # (more than catch_up were missed); None when nothing was skipped.
    skipped_from: datetime | None


@dataclass(frozen=True)
class JobTemplate:
    """The job each run enqueues; ``None`` fields take the service's defaults at enqueue time."""

    queue: str
    type: str
    payload: object = None
    priority: int = 0
    max_attempts: int | None = None
    lease_seconds: int | None = None
    timeout_seconds: int | None = None
    concurrency_key: str | None = None


@dataclass(frozen=True)
class ScheduleSpec:
    """A schedule's definition: when it runs, what it enqueues, how far it catches up.

    ``paused`` ``None`` keeps the schedule's current state (active for a new one).
    """

    timing: Timing
    template: JobTemplate
    catch_up: int = 0
    paused: bool | None = None

    def __post_init__(self) -> None:
        if not 0 <= self.catch_up <= CATCH_UP_MAX:
            raise ScheduleError("catch_up", f"must be within 0..{CATCH_UP_MAX}")
