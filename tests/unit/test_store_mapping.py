"""The store mapping: one method per named statement, in the store of its file, and no SQL elsewhere."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

from app.store import STORE_OF_FILE, Stores
from app.store.listing import BUILT
from app.store.statements import statements_by_file

APP = Path(__file__).resolve().parents[2] / "app"


def _public_methods(store: type) -> set[str]:
    return {
        name
        for name, member in inspect.getmembers(store, inspect.iscoroutinefunction)
        if not name.startswith("_")
    }


def test_every_sql_file_has_one_store_and_every_store_a_file() -> None:
    assert set(STORE_OF_FILE) == set(statements_by_file())
    assert set(BUILT) <= set(STORE_OF_FILE)
    held = {field.type for field in Stores.__dataclass_fields__.values()}
    assert {store.__name__ for store in STORE_OF_FILE.values()} == held


def test_each_statement_has_exactly_one_method_and_each_method_one_statement() -> None:
    seen: dict[str, str] = {}
    for stem, statements in statements_by_file().items():
        store = STORE_OF_FILE[stem]
        expected = set(statements) | set(BUILT.get(stem, ()))
        for name in expected:
            assert name not in seen, f"{name} is in both {seen[name]} and {stem}"
            seen[name] = stem
        assert not set(statements) & set(BUILT.get(stem, ())), stem
        methods = _public_methods(store)
        assert methods - expected == set(), f"{store.__name__} methods with no statement"
        assert expected - methods == set(), f"{stem}.sql statements with no {store.__name__} method"
        # Nothing else public either: a store is its statements.
        public = {n for n in vars(store) if not n.startswith("_")}
        assert public == methods, f"{store.__name__} has other public members: {public - methods}"


# SQL text: a keyword that starts a statement or clause, in capitals, inside a string literal.
_SQL = re.compile(
    r"""["'](?:[^"'\n]*\s)?(SELECT|INSERT\s+INTO|UPDATE\s+\w+\s+SET|DELETE\s+FROM|"""
    r"""WITH\s+\w+\s+AS|pg_notify|nextval)\b"""
)
_RAW_SQL_CALL = re.compile(r"\b(text|exec_driver_sql)\(")
# Modules outside app/store/ allowed SQL text, and why.
_SQL_ALLOWED = {
    # (and app/models/: table definitions, whose server defaults and partial-index predicates
    # are SQL fragments)
    # Engines and pools: the connection setup names session settings.
    "db.py",
    # Migrations run Alembic, which owns its SQL.
    "migrations.py",
}


def test_no_sql_outside_the_store() -> None:
    offenders = []
    for path in sorted(APP.rglob("*.py")):
        relative = path.relative_to(APP)
        if relative.parts[0] in ("store", "models") or str(relative) in _SQL_ALLOWED:
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if line.lstrip().startswith("#"):
                continue
            if _SQL.search(line) or _RAW_SQL_CALL.search(line):
                offenders.append(f"app/{relative}:{number}: {line.strip()}")
    assert offenders == []
