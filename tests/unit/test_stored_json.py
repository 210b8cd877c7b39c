"""Stored JSON read back value by value: what no reader takes becomes a marker, never an error."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from app.stored_json import UnreadableJson, job_json_errors, read_json


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ('{"a": [1, 2.5, "x", null, true]}', {"a": [1, 2.5, "x", None, True]}),
        ("12345678901234567890123", 12345678901234567890123),  # exact past 64 bits
        ("0.000000000000000000000001", 1e-24),
        ("[" * 1000 + "]" * 1000, None),  # within the parsers' depth: read (checked below)
    ],
)
def test_what_a_reader_takes_reads_as_usual(text: str, value: object) -> None:
    read = read_json(text.encode())
    assert not isinstance(read, UnreadableJson)
    if value is not None:
        assert read == value


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("1" + "0" * 5000, "a number beyond a double's range"),  # 1e5000, as jsonb writes it
        ('{"n": ' + "9" * 400 + ".5}", "a number beyond a double's range"),
        ("[" * 5000 + "]" * 5000, "nested too deep to read"),
    ],
)
def test_what_no_reader_takes_becomes_a_marker_saying_why(text: str, why: str) -> None:
    assert read_json(text) == UnreadableJson(why)


def test_a_job_names_its_unreadable_fields() -> None:
    row = SimpleNamespace(
        payload=UnreadableJson("nested too deep to read"),
        result={"ok": True},
        checkpoint=None,
        progress=None,
        errors=[],
    )
    assert job_json_errors(row) == {"payload": "nested too deep to read"}
    row.payload = {"fine": 1}
    assert job_json_errors(row) is None
