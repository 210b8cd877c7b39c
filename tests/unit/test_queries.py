"""The SQL loader: named blocks, descriptions, failing fast on bad names."""

from __future__ import annotations

import inspect

import pytest

from app.queue import repository
from app.queue.queries import load_statements, parse_statements, statement


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


def test_every_statement_has_a_description_and_a_repository_method() -> None:
    methods = {name for name, _ in inspect.getmembers(repository.Repository, inspect.isfunction)}
    for name, stmt in load_statements().items():
        assert stmt.description, name
        assert name in methods, f"statement {name} has no Repository.{name}"


def test_claim_is_one_statement_with_skip_locked() -> None:
    sql = statement("job_claim").sql
    assert sql.count(";") == 0
    assert "FOR UPDATE SKIP LOCKED" in sql and "AS MATERIALIZED" in sql
