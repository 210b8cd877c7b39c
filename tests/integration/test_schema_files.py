"""app/store/sql/schema/ is the truth about the database's own logic (issue 42).

After ``alembic upgrade head`` every jobq function, every trigger and every view of jobq's schema
must be defined in a schema file exactly as PostgreSQL holds it (``pg_get_functiondef``,
``pg_get_triggerdef``, ``pg_get_viewdef``; the schema's name stands as ``__S__``), and every
block of the files must exist. A migration that changes a function without its file, or a file
edited without a migration, fails here. Applying every block (as a migration would, through
``app.store.schema.apply``) changes nothing, and ``jobq sql`` prints both kinds of SQL.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import AsyncIterator

import asyncpg
import pytest

from app.store.schema import SCHEMA, SchemaObject, apply, parse, schema_objects
from tests.processes import REPO_ROOT, clean_environment

FUNCTIONS = """
SELECT CASE WHEN n.nspname = 'jobq' THEN 'jobq.' || p.proname ELSE p.proname END AS name,
       pg_get_functiondef(p.oid) AS sql
FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
WHERE n.nspname = 'jobq' OR (n.nspname = current_schema() AND p.proname LIKE 'jobq\\_%')
"""
TRIGGERS = """
SELECT t.tgname AS name, pg_get_triggerdef(t.oid) AS sql
FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
WHERE NOT t.tgisinternal AND c.relnamespace = current_schema()::regnamespace
"""
VIEWS = """
SELECT c.relname AS name, pg_get_viewdef(c.oid) AS sql
FROM pg_class c
WHERE c.relkind = 'v' AND c.relnamespace = current_schema()::regnamespace
"""


def comparable(sql: str, schema: str) -> str:
    """The text without the schema's qualifier (written either way, or as ``__S__``), with
    whitespace at line ends and the statement's end ignored."""
    for qualifier in (f'"{schema}".', f"{SCHEMA}."):
        sql = sql.replace(qualifier, "")
    sql = re.sub(rf"(?<![\w\"]){re.escape(schema)}\.", "", sql)
    lines = [line.rstrip() for line in sql.strip().removesuffix(";").rstrip().splitlines()]
    return "\n".join(lines)


async def as_filed(conn: asyncpg.Connection, obj: SchemaObject, schema: str) -> str:
    """What PostgreSQL answers for the object if made from its file. A view's query is deparsed
    differently from one major version to the next (16 drops the table's alias in a one-table
    query), so the file's query is made a temporary view and deparsed by the same server."""
    if obj.kind != "view":
        return obj.sql
    query = obj.statement(schema).split(" AS\n", 1)[1]
    transaction = conn.transaction()
    await transaction.start()
    try:
        await conn.execute(f"CREATE TEMPORARY VIEW jobq_filed_view AS {query}")
        deparsed: str = await conn.fetchval("SELECT pg_get_viewdef('jobq_filed_view'::regclass)")
    finally:
        await transaction.rollback()
    return deparsed


@pytest.fixture
async def conn(database_url: str) -> AsyncIterator[asyncpg.Connection]:
    connection = await asyncpg.connect(database_url)
    yield connection
    await connection.close()


async def catalog(conn: asyncpg.Connection) -> dict[tuple[str, str], str]:
    found: dict[tuple[str, str], str] = {}
    for kind, query in (("function", FUNCTIONS), ("trigger", TRIGGERS), ("view", VIEWS)):
        for row in await conn.fetch(query):
            found[(kind, row["name"])] = row["sql"]
    return found


async def test_every_function_trigger_and_view_is_defined_in_its_file_as_the_database_holds_it(
    conn: asyncpg.Connection,
) -> None:
    schema = await conn.fetchval("SELECT current_schema()")
    held = await catalog(conn)
    filed = {(obj.kind, obj.name): obj for obj in schema_objects()}
    assert sorted(set(held) - set(filed)) == [], "in the database, in no schema file"
    assert sorted(set(filed) - set(held)) == [], "in a schema file, not in the database"
    differ = [
        f"{kind} {name} ({filed[(kind, name)].file})"
        for (kind, name), sql in sorted(held.items())
        if comparable(sql, schema)
        != comparable(await as_filed(conn, filed[(kind, name)], schema), schema)
    ]
    assert differ == [], "defined otherwise in the database than in its file"
    assert len(held) >= 40  # 23 functions, 17 triggers and a view when this was written


async def test_applying_the_files_changes_nothing(conn: asyncpg.Connection) -> None:
    schema = await conn.fetchval("SELECT current_schema()")
    before = await catalog(conn)
    transaction = conn.transaction()
    await transaction.start()
    try:
        statements: list[str] = []
        apply(statements.append, schema, [obj.name for obj in schema_objects()])
        for sql in statements:
            await conn.execute(sql)
        after = await catalog(conn)
    finally:
        await transaction.rollback()
    assert len(statements) == len(schema_objects())
    assert {key: comparable(sql, schema) for key, sql in after.items()} == {
        key: comparable(sql, schema) for key, sql in before.items()
    }


def test_a_block_needs_a_description_and_a_statement() -> None:
    with pytest.raises(ValueError, match="jobq_x needs a description"):
        parse(
            "-- function: jobq_x\nCREATE FUNCTION jobq_x() RETURNS int LANGUAGE sql AS 'SELECT 1'",
            "f.sql",
        )
    with pytest.raises(ValueError, match="jobq_y needs a description"):
        parse("-- function: jobq_y\n-- says what it does\n", "f.sql")
    [obj] = parse(
        "-- view: v\n-- the view\nCREATE OR REPLACE VIEW __S__.v AS\n SELECT 1;\n", "f.sql"
    )
    assert (obj.kind, obj.name, obj.description) == ("view", "v", "the view")
    assert obj.statement('odd"name') == 'CREATE OR REPLACE VIEW "odd""name".v AS\n SELECT 1'


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("job_claim", "-- $1 = :queues, $2 = :max_jobs"),
        ("jobq_counts_updated", 'CREATE OR REPLACE FUNCTION "jobs_app".jobq_counts_updated()'),
        ("jobs_linked_settled", "CREATE OR REPLACE TRIGGER jobs_linked_settled AFTER UPDATE OF"),
    ],
)
def test_jobq_sql_prints_statements_and_schema_objects(name: str, expected: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "app.cli", "sql", name, "--schema", "jobs_app"],
        cwd=REPO_ROOT,
        env=clean_environment(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert expected in done.stdout
    assert "{{" not in done.stdout and SCHEMA not in done.stdout
    assert done.stdout.rstrip().endswith(";")


def test_jobq_sql_names_what_it_does_not_know() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "app.cli", "sql", "no_such_thing"],
        cwd=REPO_ROOT,
        env=clean_environment(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert "no statement, function, trigger or view named 'no_such_thing'" in done.stderr
