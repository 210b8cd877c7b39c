"""Migrations: upgrade -> downgrade -> upgrade round trip; the models match the migrations."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect, text
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

from app.db import async_url
from app.migrations import downgrade, upgrade
from app.models import metadata
from tests.conftest import create_database, drop_database


@pytest.fixture
def empty_database(pg_server_url: str) -> Iterator[str]:
    url = create_database(pg_server_url, prefix="jobq_migrations")
    yield url
    drop_database(pg_server_url, url)


async def _inspect(url: str, fn: Any) -> Any:
    engine = create_async_engine(async_url(url), poolclass=NullPool)
    try:
        async with engine.connect() as conn:
            return await conn.run_sync(fn)
    finally:
        await engine.dispose()


def _tables(conn: Connection) -> set[str]:
    return set(inspect(conn).get_table_names())


def _functions(conn: Connection) -> set[str]:
    rows = conn.execute(text("SELECT proname FROM pg_proc WHERE proname LIKE 'jobq_%'"))
    return {r[0] for r in rows}


def _diff(conn: Connection) -> list[Any]:
    context = MigrationContext.configure(conn, opts={"compare_server_default": True})
    return list(compare_metadata(context, metadata))


def test_upgrade_downgrade_upgrade_round_trip(empty_database: str) -> None:
    upgrade(empty_database)
    assert {"jobs", "queues", "alembic_version"} <= asyncio.run(_inspect(empty_database, _tables))
    assert asyncio.run(_inspect(empty_database, _functions)) == {
        "jobq_backoff",
        "jobq_errors_append",
    }
    downgrade(empty_database, "base")
    assert asyncio.run(_inspect(empty_database, _tables)) == {"alembic_version"}
    assert asyncio.run(_inspect(empty_database, _functions)) == set()
    upgrade(empty_database)
    assert {"jobs", "queues"} <= asyncio.run(_inspect(empty_database, _tables))


def test_models_match_migrations(empty_database: str) -> None:
    upgrade(empty_database)
    assert asyncio.run(_inspect(empty_database, _diff)) == []
