"""Strict JSON parsing, cursors, settings and URL handling (no database)."""

from __future__ import annotations

import pytest
from fastapi.exceptions import RequestValidationError

from app.api.new_jobs import request_fingerprint
from app.api.schemas import EnqueueRequest
from app.db import async_url
from app.errors import InvalidInput, field_name
from app.http.strict_json import parse_strict_json
from app.queue.cursors import decode_cursor, encode_cursor
from app.settings import Settings


def _loc(raw: bytes) -> tuple[object, ...]:
    with pytest.raises(RequestValidationError) as info:
        parse_strict_json(raw, max_depth=8)
    loc: tuple[object, ...] = tuple(info.value.errors()[0]["loc"])
    return loc


def test_strict_json_accepts_ordinary_values() -> None:
    assert parse_strict_json(b'{"a": [1, 2.5, "x", null, true]}') == {
        "a": [1, 2.5, "x", None, True]
    }


def test_strict_json_locates_the_problem() -> None:
    assert _loc(b'{"a": [1, "\\u0000"]}') == ("body", "a", 1)
    assert _loc(b'{"a": NaN}') == ("body",)
    assert _loc(b"[" * 20 + b"]" * 20) == ("body", *[0] * 8)
    # Past shallow siblings and through objects, to the first container past the depth.
    deep = b'{"jobs": [{"payload": {"b": [1]}}, {"payload": {"a": [[[[[[1]]]]]]}}]}'
    assert _loc(deep) == ("body", "jobs", 1, "payload", "a", 0, 0, 0, 0)
    assert parse_strict_json(deep, max_depth=10)["jobs"][0] == {"payload": {"b": [1]}}


def test_strict_json_keeps_integers_past_64_bits_exact() -> None:
    # orjson would read this as a float; the parser must hand it on unchanged.
    big = 123456789012345678901234567890
    assert parse_strict_json(b'{"id": ' + str(big).encode() + b"}") == {"id": big}


@pytest.mark.parametrize(
    "raw",
    [
        b'{"a": 1e400}',
        b'{"a": -1e400}',
        b'{"a": "\\ud800"}',
        b'{"k\\u0000": 1}',
        b'{"a": Infinity}',
    ],
)
def test_strict_json_refuses_what_jsonb_cannot_store(raw: bytes) -> None:
    with pytest.raises(RequestValidationError):
        parse_strict_json(raw, max_depth=8)


def test_cursor_round_trip_and_garbage() -> None:
    assert decode_cursor(encode_cursor(12345)) == 12345
    for bad in ("", "!!", "djE6YWJj", encode_cursor(1) + "x" * 3):
        with pytest.raises(InvalidInput):
            decode_cursor(bad)


def test_fingerprint_ignores_key_and_sees_payload() -> None:
    a = EnqueueRequest(type="t", payload={"x": 1}, idempotency_key="k")
    b = EnqueueRequest(type="t", payload={"x": 1}, idempotency_key="other")
    c = EnqueueRequest(type="t", payload={"x": 2}, idempotency_key="k")
    assert request_fingerprint(a) == request_fingerprint(b) != request_fingerprint(c)


def test_field_name_renders_paths() -> None:
    assert field_name(("body", "jobs", 3, "queue")) == "body.jobs[3].queue"


def test_settings_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DATABASE_URL", "postgresql://u@h/db")
    monkeypatch.setenv("JOBQ_PORT", "9001")
    monkeypatch.setenv("JOBQ_DATA_DIR", "/srv/jobq")
    settings = Settings()
    assert settings.database_url == "postgresql://u@h/db" and settings.port == 9001
    assert str(settings.data_dir) == "/srv/jobq"
    with pytest.raises(ValueError):
        Settings(backoff_base_seconds=10, backoff_cap_seconds=1)


def test_async_url_normalises_drivers() -> None:
    assert async_url("postgres://u@h/db").drivername == "postgresql+asyncpg"
    assert async_url("postgresql+psycopg://u@h/db").drivername == "postgresql+asyncpg"
    with pytest.raises(ValueError):
        async_url("mysql://u@h/db")


def test_brief_keeps_one_line_of_an_error() -> None:
    from app.errors import brief

    exc = ValueError("connection lost\n[SQL: SELECT a very long statement]\n[parameters: ...]")
    assert brief(exc) == "ValueError: connection lost"
    assert brief(RuntimeError()) == "RuntimeError: "
