"""The window of instants the queue accepts, checked in UTC after the offset is applied (pure)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from app.domain.bounds import EARLIEST_INSTANT, LATEST_INSTANT, instant_in_window

PLUS_5 = timezone(timedelta(hours=5))
MINUS_5 = timezone(timedelta(hours=-5))


@pytest.mark.parametrize(
    "value",
    [
        datetime(1, 1, 1, tzinfo=PLUS_5),  # 1 BC in UTC: Python cannot even hold it
        datetime(9999, 12, 31, 23, 59, 59, tzinfo=MINUS_5),  # year 10000 in UTC
        datetime(1969, 12, 31, 23, 59, 59, tzinfo=UTC),
        datetime(1970, 1, 1, 4, 59, 59, tzinfo=PLUS_5),  # 23:59:59 the day before, in UTC
        LATEST_INSTANT,
        datetime(8999, 12, 31, 20, 0, tzinfo=MINUS_5),  # 9000-01-01T01:00Z
    ],
)
def test_instants_outside_the_window_are_refused(value: datetime) -> None:
    with pytest.raises(ValueError, match="must lie between"):
        instant_in_window(value)


@pytest.mark.parametrize(
    ("value", "utc"),
    [
        (EARLIEST_INSTANT, EARLIEST_INSTANT),
        (datetime(1970, 1, 1, 5, 0, tzinfo=PLUS_5), EARLIEST_INSTANT),
        (datetime(2026, 12, 1, 12, 0), datetime(2026, 12, 1, 12, 0, tzinfo=UTC)),  # naive is UTC
        (LATEST_INSTANT - timedelta(microseconds=1), LATEST_INSTANT - timedelta(microseconds=1)),
    ],
)
def test_instants_inside_the_window_are_answered_in_utc(value: datetime, utc: datetime) -> None:
    assert instant_in_window(value) == utc
