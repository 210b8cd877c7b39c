"""Databases of their own next to the benchmark's, on the same server: the lean baseline's and
each peer's (``bench/lean.py``, ``bench/peers.py``, ``bench/procrastinate_peer.py``).

A target whose tables live in a database of its own leaves the jobq database's figures (its
commits, statement calls, triggers and counters) untouched, while sharing the server, its
settings and its transaction ids with every other target of the run.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg

ORCHESTRATOR = "bench-orchestrator"


@contextlib.asynccontextmanager
async def sibling(dsn: str, suffix: str) -> AsyncIterator[tuple[str, str]]:
    """A fresh database named after ``dsn``'s plus ``_suffix`` on its server; dropped after.

    Answers its name and its DSN.
    """
    server = await asyncpg.connect(dsn)
    name = f"{await server.fetchval('SELECT current_database()')}_{suffix}"
    try:
        await server.execute(f'CREATE DATABASE "{name}"')
        yield name, urlunsplit(urlsplit(dsn)._replace(path=f"/{name}"))
    finally:
        await server.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await server.close()


async def connect(dsn: str) -> Any:
    """The orchestrator's connection to a sibling database (named ``bench-orchestrator``)."""
    return await asyncpg.connect(dsn, server_settings={"application_name": ORCHESTRATOR})
