"""The one connection type every store method takes, over either driver the process uses.

The hot statements (enqueue, claim, the lease calls) run on asyncpg connections from the driver
pool, prepared and cached by the driver with none of SQLAlchemy's per-call machinery
(docs/adr/0002-hot-path-on-the-driver-pool.md); everything else runs on SQLAlchemy connections. A store
method does not care which: it names its statement and hands its parameters to :class:`Conn`,
and the unit of work decides which pool a call runs on. The Core builders (listings, counts,
bulk batches) run on a SQLAlchemy connection only.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import orjson
from sqlalchemy import Executable
from sqlalchemy.ext.asyncio import AsyncConnection

from app.store.statements import statement

# A row as either driver answers it: asyncpg's Record or SQLAlchemy's RowMapping.
Row = Mapping[str, Any]


def _json_default(value: object) -> str:
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, datetime):  # orjson writes these itself; Python's encoder does not
        return value.isoformat()
    raise TypeError(f"cannot encode {type(value).__name__} as JSON")


def to_json(value: object) -> str:
    """Encodes a value for a jsonb parameter (request parsing has refused NaN and Infinity)."""
    try:
        return orjson.dumps(value, default=_json_default).decode()
    except TypeError:
        # Integers past 64 bits, which jsonb stores exactly: Python's encoder writes them.
        return json.dumps(value, separators=(",", ":"), default=_json_default)


class Conn:
    """A database connection as the stores see it: runs named statements and built queries."""

    __slots__ = ("raw",)

    def __init__(self, raw: Any) -> None:
        self.raw = raw

    async def fetch(self, name: str, params: Mapping[str, Any] | None = None) -> Sequence[Row]:
        """Runs the named statement with ``params``; answers its rows."""
        raise NotImplementedError

    async def fetch_query(self, query: Executable) -> Sequence[Row]:
        """Runs a statement built with SQLAlchemy Core; answers its rows."""
        raise TypeError(
            f"{type(self).__name__} runs named statements only; built queries need a "
            "SQLAlchemy connection"
        )

    @staticmethod
    def of(raw: Any) -> Conn:
        """The ``Conn`` over a SQLAlchemy ``AsyncConnection`` or an asyncpg connection (or itself)."""
        if isinstance(raw, Conn):
            return raw
        if isinstance(raw, AsyncConnection):
            return EngineConn(raw)
        return DriverConn(raw)


class DriverConn(Conn):
    """An asyncpg connection: each named statement runs prepared, from the driver's cache."""

    __slots__ = ()

    async def fetch(self, name: str, params: Mapping[str, Any] | None = None) -> Sequence[Row]:
        """Runs the named statement with ``params`` as positional arguments; answers its rows."""
        named = statement(name)
        sql, _ = named.positional
        rows: Sequence[Row] = await self.raw.fetch(sql, *named.arguments(dict(params or {})))
        return rows


class EngineConn(Conn):
    """A SQLAlchemy ``AsyncConnection``: for everything off the hot path, builders included."""

    __slots__ = ()

    async def fetch(self, name: str, params: Mapping[str, Any] | None = None) -> Sequence[Row]:
        """Runs the named statement as a ``text()`` clause; answers its rows as mappings."""
        result = await self.raw.execute(statement(name).clause, dict(params or {}))
        return result.mappings().all() if result.returns_rows else ()

    async def fetch_query(self, query: Executable) -> Sequence[Row]:
        """Runs a statement built with SQLAlchemy Core; answers its rows as mappings."""
        result = await self.raw.execute(query)
        return result.mappings().all() if result.returns_rows else ()
