"""The database's own logic as it is today: ``app/store/sql/schema/*.sql``, one file per area.

Each file holds the current definition of every function, trigger and view of its area, each
in a block that starts with ``-- function: <name>``, ``-- trigger: <name>`` or ``-- view:
<name>``, then the comment lines that say what it does, then the statement. ``__S__.`` stands
for jobq's schema (the one the migrations ran in), written in when a statement is applied.

The files are the truth: tests/integration/test_schema_files.py compares every block with what
PostgreSQL holds after ``alembic upgrade head`` (``pg_get_functiondef``, ``pg_get_triggerdef``,
``pg_get_viewdef``), and fails on a difference or on an object no file holds. A migration that
changes one of them edits its file and applies it with :func:`apply`; migrations written before
these files keep their own copies, the steps that history needs. Named statements
(``app/store/sql/*.sql``, app/store/statements.py) are another thing: the SQL the service sends.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cache
from importlib import resources

SCHEMA = "__S__"
KINDS = ("function", "trigger", "view")
_BLOCK_LINE = re.compile(r"^-- (function|trigger|view): ([a-z][a-z0-9_.]*)\s*$", re.MULTILINE)


@dataclass(frozen=True)
class SchemaObject:
    """One function, trigger or view: where its definition lives and what it says."""

    kind: str
    name: str
    file: str  # the file's name within app/store/sql/schema/
    description: str  # the comment lines after the block line, without their "-- "
    sql: str  # the statement as the file writes it, ``__S__.`` for jobq's schema, no ";"

    def statement(self, schema: str) -> str:
        """The statement to run for ``schema``: the definition created or replaced in place."""
        sql = self.sql.replace(f"{SCHEMA}.", f"{quote_ident(schema)}.")
        if self.kind == "trigger":
            # pg_get_triggerdef's form; replacing keeps the trigger's place among the others.
            sql = re.sub(r"^CREATE TRIGGER\b", "CREATE OR REPLACE TRIGGER", sql)
        return sql


def quote_ident(name: str) -> str:
    """``name`` as a quoted SQL identifier."""
    return '"' + name.replace('"', '""') + '"'


def parse(source: str, file: str) -> list[SchemaObject]:
    """The blocks of one schema file, in file order."""
    marks = list(_BLOCK_LINE.finditer(source))
    objects: list[SchemaObject] = []
    for mark, following in zip(marks, [*marks[1:], None], strict=True):
        body = source[mark.end() : following.start() if following else len(source)]
        lines = body.strip("\n").splitlines()
        described = 0
        while described < len(lines) and lines[described].startswith("--"):
            described += 1
        description = " ".join(line.removeprefix("--").strip() for line in lines[:described])
        sql = "\n".join(lines[described:]).strip()
        sql = sql.removesuffix(";").rstrip()
        if not description or not sql:
            raise ValueError(f"{file}: {mark.group(2)} needs a description and a statement")
        objects.append(SchemaObject(mark.group(1), mark.group(2), file, description, sql))
    return objects


@cache
def schema_objects() -> tuple[SchemaObject, ...]:
    """Every block of every schema file, files in name order; a name may appear once."""
    folder = resources.files("app.store") / "sql" / "schema"
    objects: list[SchemaObject] = []
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".sql"):
            objects.extend(parse(entry.read_text(encoding="utf-8"), entry.name))
    seen: set[tuple[str, str]] = set()
    for obj in objects:
        if (obj.kind, obj.name) in seen:
            raise ValueError(f"{obj.kind} {obj.name} is defined in two blocks")
        seen.add((obj.kind, obj.name))
    return tuple(objects)


def schema_object(name: str) -> SchemaObject:
    """The function, trigger or view of that name; ``KeyError`` naming the known ones if none."""
    for obj in schema_objects():
        if obj.name == name:
            return obj
    raise KeyError(f"no function, trigger or view named {name!r} in app/store/sql/schema/")


def apply(execute: Callable[[str], object], schema: str, names: Iterable[str]) -> None:
    """Creates or replaces the named objects in ``schema`` as their files define them today,
    for a migration: ``apply(op.execute, schema, ["jobq_counts_updated"])``."""
    for name in names:
        execute(schema_object(name).statement(schema))
