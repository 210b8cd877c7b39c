"""The job search filters the API and the dashboard share, and driver errors as jobq errors (no database)."""

from __future__ import annotations

import asyncpg
import pytest
from sqlalchemy.exc import DBAPIError

from app.api.filters import (
    CURSOR_MAX_CHARS,
    is_cursor,
    is_job_type,
    is_queue_name,
    job_search,
    payload_filter,
)
from app.auth.keys import NOBODY, Principal, Role
from app.domain.states import JobStatus
from app.errors import Forbidden, InvalidInput, UnusableValue, values_refused


def test_queue_names_follow_the_api_rule() -> None:
    assert is_queue_name("emails", 8)
    assert is_queue_name("a.b:c-d_e", 9)
    assert not is_queue_name("/etc", 8)
    assert not is_queue_name("_x", 8)
    assert not is_queue_name("q" * 9, 8)


def test_job_types_cursors() -> None:
    assert is_job_type("welcome", 10) and not is_job_type("", 10)
    assert not is_job_type("a\x00b", 10) and not is_job_type("x" * 11, 10)
    assert is_cursor("x" * CURSOR_MAX_CHARS)
    assert not is_cursor("x" * (CURSOR_MAX_CHARS + 1)) and not is_cursor("é")


def test_a_payload_filter_error_names_the_field_as_the_caller_spells_it() -> None:
    assert payload_filter('{"user": 42}') == {"user": 42}
    for field in ("query.payload", "payload"):
        with pytest.raises(InvalidInput) as info:
            payload_filter("{user: 42}", field=field)
        assert info.value.errors[0]["field"] == field
        assert info.value.detail.startswith("payload filter: ")


def test_job_search_builds_the_search_within_scopes() -> None:
    search = job_search(NOBODY, prefix="query.", queue="emails", status=JobStatus.DEAD)
    assert search.queue == "emails" and search.status is JobStatus.DEAD
    assert search.queue_patterns is None


def test_job_search_names_the_queue_field_with_the_prefix() -> None:
    scoped = Principal(key_id=7, name="mailer", role=Role.ADMIN, queues=("emails",))
    assert job_search(scoped, prefix="").queue_patterns == ("emails",)
    for prefix in ("query.", "body.", ""):
        with pytest.raises(Forbidden) as info:
            job_search(scoped, prefix=prefix, queue="billing")
        assert info.value.errors[0]["field"] == f"{prefix}queue"


def _wrapped(exc: Exception) -> DBAPIError:
    return DBAPIError("SELECT 1", {}, exc)


def test_data_exceptions_become_unusable_values() -> None:
    for raised in (
        asyncpg.NumericValueOutOfRangeError("out of range"),
        _wrapped(asyncpg.InvalidTextRepresentationError("bad text")),
    ):
        with pytest.raises(UnusableValue) as info, values_refused():
            raise raised
        assert isinstance(info.value, InvalidInput)
        assert info.value.__cause__ is raised


def test_other_driver_errors_pass_unchanged() -> None:
    other = asyncpg.UniqueViolationError("taken")
    with pytest.raises(asyncpg.UniqueViolationError), values_refused():
        raise other
    wrapped = _wrapped(asyncpg.AdminShutdownError("gone"))
    with pytest.raises(DBAPIError), values_refused():
        raise wrapped
