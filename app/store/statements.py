"""Loads the named statements in ``app/store/sql/*.sql`` once, failing fast on a bad name.

A file may also hold ``-- fragment: <name>`` blocks: SQL shared by several statements of that
file, written into them where they say ``{{ <name> }}``. Fragments are not statements.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from sqlalchemy import TextClause, text

_BLOCK_LINE = re.compile(r"^-- (name|fragment): ([a-z][a-z0-9_]*)\s*$", re.MULTILINE)
_INCLUDE = re.compile(r"\{\{\s*([a-z][a-z0-9_]*)\s*\}\}")
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


def _blocks(source: str) -> list[tuple[str, str, str, str]]:
    """The file's blocks in order: (kind, name, description, SQL)."""
    matches = list(_BLOCK_LINE.finditer(source))
    blocks = []
    for index, match in enumerate(matches):
        kind, name = match.group(1), match.group(2)
        end = matches[index + 1].start() if index + 1 < len(matches) else len(source)
        body_lines = source[match.end() : end].strip().splitlines()
        description = ""
        if body_lines and body_lines[0].startswith("--"):
            description = body_lines[0].lstrip("- ").strip()
        sql = "\n".join(line for line in body_lines if not line.lstrip().startswith("--"))
        sql = sql.strip().rstrip(";").strip()
        if not sql:
            raise ValueError(f"{kind} {name!r} has no SQL")
        blocks.append((kind, name, description, sql))
    return blocks


def _expand(sql: str, fragments: dict[str, str], owner: str, within: tuple[str, ...] = ()) -> str:
    """``sql`` with each ``{{ fragment }}`` written in, fragments within fragments too."""

    def include(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in fragments:
            raise ValueError(f"{owner!r} includes unknown fragment {name!r}")
        if name in within:
            raise ValueError(f"fragment {name!r} includes itself ({' > '.join(within)})")
        return _expand(fragments[name], fragments, owner, (*within, name))

    return _INCLUDE.sub(include, sql)


def parse_statements(source: str) -> dict[str, NamedStatement]:
    """Splits a SQL file into its ``-- name:`` blocks, with their fragments written in.

    Duplicate names, empty blocks and unknown fragments are errors.
    """
    blocks = _blocks(source)
    fragments: dict[str, str] = {}
    for kind, name, _, sql in blocks:
        if kind == "fragment":
            if name in fragments:
                raise ValueError(f"fragment {name!r} is defined twice")
            fragments[name] = sql
    statements: dict[str, NamedStatement] = {}
    for kind, name, description, sql in blocks:
        if kind != "name":
            continue
        if name in statements:
            raise ValueError(f"statement {name!r} is defined twice")
        statements[name] = NamedStatement(
            name=name, description=description, sql=_expand(sql, fragments, name)
        )
    return statements


@cache
def statements_by_file() -> dict[str, dict[str, NamedStatement]]:
    """The named statements of each file of the store's SQL folder (by file stem), read once."""
    folder = resources.files("app.store") / "sql"
    files: dict[str, dict[str, NamedStatement]] = {}
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".sql"):
            files[entry.name.removesuffix(".sql")] = parse_statements(
                entry.read_text(encoding="utf-8")
            )
    return files


@cache
def load_statements() -> dict[str, NamedStatement]:
    """All named statements of the store's SQL folder, read once."""
    statements: dict[str, NamedStatement] = {}
    for parsed in statements_by_file().values():
        for name, named in parsed.items():
            if name in statements:
                raise ValueError(f"statement {name!r} is defined in two files")
            statements[name] = named
    return statements


def statement(name: str) -> NamedStatement:
    """The named statement; an unknown name raises ``KeyError`` at once."""
    statements = load_statements()
    if name not in statements:
        raise KeyError(f"no SQL statement named {name!r}; known: {sorted(statements)}")
    return statements[name]
