"""What the storage can hold: integer ranges of its columns and the window of instants it accepts.

These are not settings: the schema holds them (column types, check constraints), so a request
outside them is refused before any SQL runs. Configurable limits live in ``app.settings``.
"""

from __future__ import annotations

from datetime import UTC, datetime

MAX_BIGINT = 2**63 - 1
MIN_INT4 = -(2**31)
MAX_INT4 = 2**31 - 1

# Every instant the queue stores lies in [EARLIEST_INSTANT, LATEST_INSTANT), checked in UTC after
# the offset is applied (and by the check constraint ck_jobs_run_at_window). PostgreSQL holds far
# more, but the driver turns values into Python datetimes, which end at year 9999: a row outside
# that range could be stored but never read back. Computed instants (now() plus a delay, a lease,
# a backoff or a timeout) stay inside because each of those durations is bounded below.
EARLIEST_INSTANT = datetime(1970, 1, 1, tzinfo=UTC)
LATEST_INSTANT = datetime(9000, 1, 1, tzinfo=UTC)

LEASE_SECONDS_MAX = 12 * 3600  # ck_jobs_lease_seconds
TIMEOUT_SECONDS_MAX = 7 * 24 * 3600  # ck_jobs_timeout_seconds
DELAY_SECONDS_MAX = 10 * 366 * 24 * 3600
RETRY_DELAY_SECONDS_MAX = 30 * 24 * 3600  # fail's retry_after_seconds, release's delay_seconds
BACKOFF_CAP_SECONDS_MAX = 30 * 24 * 3600
MAX_ATTEMPTS_MAX = 1000


def instant_in_window(value: datetime) -> datetime:
    """The instant in UTC (a naive value is taken as UTC); ``ValueError`` outside the window."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    try:
        utc = value.astimezone(UTC)
    except OverflowError:
        # Year 1 at +05:00 is 1 BC in UTC; year 9999 at -05:00 is year 10000.
        utc = None
    if utc is None or not EARLIEST_INSTANT <= utc < LATEST_INSTANT:
        raise ValueError(
            f"must lie between {EARLIEST_INSTANT.isoformat()} and {LATEST_INSTANT.isoformat()} "
            "(exclusive) in UTC"
        )
    return utc


def valid_id(job_id: int) -> bool:
    """Whether ``job_id`` can name a row (a positive bigint)."""
    return 1 <= job_id <= MAX_BIGINT


# A failure's structured error (POST /v1/fail): the exception's type name is refused beyond this
# length; its traceback is kept to its last TRACEBACK_MAX_CHARS characters (the exception line
# is the last), its message to the service's error_text_max_chars.
ERROR_TYPE_MAX_CHARS = 200
TRACEBACK_MAX_CHARS = 16_000
