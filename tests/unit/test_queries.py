"""The SQL loader: named blocks, fragments, descriptions, failing fast on bad names."""

from __future__ import annotations

import pytest

from app.store.statements import load_statements, parse_statements, statement


def test_parses_names_descriptions_and_sql() -> None:
    parsed = parse_statements(
        "-- header\n\n-- name: job_a\n-- Does A.\nSELECT 1;\n\n-- name: job_b\n-- B.\nSELECT\n 2;\n"
    )
    assert list(parsed) == ["job_a", "job_b"]
    assert parsed["job_a"].description == "Does A." and parsed["job_a"].sql == "SELECT 1"
    assert parsed["job_b"].sql == "SELECT\n 2"


def test_duplicate_and_empty_blocks_fail() -> None:
    with pytest.raises(ValueError, match="twice"):
        parse_statements("-- name: a\nSELECT 1;\n-- name: a\nSELECT 2;\n")
    with pytest.raises(ValueError, match="no SQL"):
        parse_statements("-- name: a\n-- nothing here\n")


def test_unknown_name_fails_fast() -> None:
    with pytest.raises(KeyError, match="no SQL statement named"):
        statement("job_teleport")


def test_every_statement_has_a_description() -> None:
    for name, stmt in load_statements().items():
        assert stmt.description, name


def test_fragments_are_written_into_statements_and_are_not_statements() -> None:
    parsed = parse_statements(
        "-- fragment: walk\n-- The walk.\nSELECT id FROM jobs\n\n"
        "-- name: job_a\n-- A.\nWITH w AS ({{ walk }}) SELECT * FROM w;\n"
    )
    assert list(parsed) == ["job_a"]
    assert parsed["job_a"].sql == "WITH w AS (SELECT id FROM jobs) SELECT * FROM w"
    with pytest.raises(ValueError, match="unknown fragment"):
        parse_statements("-- name: job_a\nSELECT {{ nowhere }};\n")


def test_a_fragment_may_include_fragments_but_not_itself() -> None:
    parsed = parse_statements(
        "-- fragment: ids\n-- Ids.\nSELECT id FROM jobs\n\n"
        "-- fragment: walk\n-- The walk.\nw AS ({{ ids }})\n\n"
        "-- name: job_a\n-- A.\nWITH {{ walk }} SELECT * FROM w;\n"
    )
    assert parsed["job_a"].sql == "WITH w AS (SELECT id FROM jobs) SELECT * FROM w"
    with pytest.raises(ValueError, match="includes itself"):
        parse_statements(
            "-- fragment: a\n-- A.\n({{ b }})\n\n-- fragment: b\n-- B.\n({{ a }})\n\n"
            "-- name: job_a\n-- A.\nSELECT {{ a }};\n"
        )


def test_claim_is_one_statement_with_skip_locked() -> None:
    sql = statement("job_claim").sql
    assert sql.count(";") == 0
    assert "FOR UPDATE SKIP LOCKED" in sql and "AS MATERIALIZED" in sql
