"""Loads the named statements in ``sql/*.sql`` once, as ``text()`` objects, failing fast on a bad name."""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from sqlalchemy import TextClause, text

_NAME_LINE = re.compile(r"^-- name: ([a-z][a-z0-9_]*)\s*$", re.MULTILINE)
# A :name bind, not the second colon of a ``::type`` cast nor a colon inside a word.
_BIND = re.compile(r"(?<![:\w]):([a-z_][a-z0-9_]*)")


@dataclass(frozen=True)
class NamedStatement:
    """One statement from the SQL folder: its name, one-line description and compiled text."""

    name: str
    description: str
    sql: str

    @property
    def clause(self) -> TextClause:
        """The statement as a SQLAlchemy ``text()`` clause."""
        return _clause(self.sql)

    @property
    def positional(self) -> tuple[str, tuple[str, ...]]:
        """The statement for the driver: ``$1, $2 ...`` in place of binds, and the bind names in order."""
        return _positional(self.sql)

    def arguments(self, params: dict[str, Any]) -> list[Any]:
        """The values of ``params`` in the order of the statement's positional parameters."""
        try:
            return [params[name] for name in self.positional[1]]
        except KeyError as missing:
            raise KeyError(f"statement {self.name!r} needs {missing}") from None


@cache
def _clause(sql: str) -> TextClause:
    return text(sql)


@cache
def _positional(sql: str) -> tuple[str, tuple[str, ...]]:
    names: list[str] = []

    def number(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in names:
            names.append(name)
        return f"${names.index(name) + 1}"

    return _BIND.sub(number, sql), tuple(names)


def parse_statements(source: str) -> dict[str, NamedStatement]:
    """Splits a SQL file into its ``-- name:`` blocks; duplicates and empty blocks are errors."""
    matches = list(_NAME_LINE.finditer(source))
    statements: dict[str, NamedStatement] = {}
    for index, match in enumerate(matches):
        name = match.group(1)
        end = matches[index + 1].start() if index + 1 < len(matches) else len(source)
        body_lines = source[match.end() : end].strip().splitlines()
        description = ""
        if body_lines and body_lines[0].startswith("--"):
            description = body_lines[0].lstrip("- ").strip()
        sql = "\n".join(line for line in body_lines if not line.lstrip().startswith("--"))
        sql = sql.strip().rstrip(";").strip()
        if not sql:
            raise ValueError(f"statement {name!r} has no SQL")
        if name in statements:
            raise ValueError(f"statement {name!r} is defined twice")
        statements[name] = NamedStatement(name=name, description=description, sql=sql)
    return statements


@cache
def load_statements() -> dict[str, NamedStatement]:
    """All named statements of the package's SQL folder, read once."""
    folder = resources.files("app.queue") / "sql"
    statements: dict[str, NamedStatement] = {}
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if not entry.name.endswith(".sql"):
            continue
        for name, statement in parse_statements(entry.read_text(encoding="utf-8")).items():
            if name in statements:
                raise ValueError(f"statement {name!r} is defined in two files")
            statements[name] = statement
    return statements


def statement(name: str) -> NamedStatement:
    """The named statement; an unknown name raises ``KeyError`` at once."""
    statements = load_statements()
    if name not in statements:
        raise KeyError(f"no SQL statement named {name!r}; known: {sorted(statements)}")
    return statements[name]
