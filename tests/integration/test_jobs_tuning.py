"""Migration 0008: the jobs table carries its fillfactor and autovacuum parameters; downgrade removes them."""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

from app.db import async_url
from app.migrations import downgrade, migrations_home, upgrade
from tests.conftest import create_database, drop_database

MIGRATION = Path(migrations_home(), "alembic", "versions", "20261201_0008_jobs_tuning.py")


def _migration() -> ModuleType:
    spec = importlib.util.spec_from_file_location("jobs_tuning_0008", MIGRATION)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


EXPECTED = {f"{name}={value}" for name, value in _migration().STORAGE_PARAMETERS.items()}


async def _reloptions(url: str) -> set[str]:
    engine = create_async_engine(async_url(url), poolclass=NullPool)
    try:
        async with engine.connect() as conn:
            options = await conn.scalar(
                text("SELECT reloptions FROM pg_class WHERE oid = 'jobs'::regclass")
            )
            return set(options or [])
    finally:
        await engine.dispose()


@pytest.fixture
def empty_database(pg_server_url: str) -> Iterator[str]:
    url = create_database(pg_server_url, prefix="jobq_tuning")
    yield url
    drop_database(pg_server_url, url)


def test_expected_parameters_are_the_ones_documented() -> None:
    assert {
        "fillfactor=80",
        "autovacuum_vacuum_scale_factor=0.02",
        "autovacuum_vacuum_insert_scale_factor=0.05",
        "autovacuum_analyze_scale_factor=0.02",
        "autovacuum_vacuum_cost_delay=1",
    } == EXPECTED


def test_migrated_jobs_table_carries_the_storage_parameters(database_url: str) -> None:
    assert asyncio.run(_reloptions(database_url)) >= EXPECTED


def test_downgrade_to_0007_removes_them_and_upgrade_restores_them(empty_database: str) -> None:
    upgrade(empty_database, "0007")
    assert asyncio.run(_reloptions(empty_database)) == set()
    upgrade(empty_database, "0008")
    assert asyncio.run(_reloptions(empty_database)) == EXPECTED
    downgrade(empty_database, "0007")
    assert asyncio.run(_reloptions(empty_database)) == set()
    upgrade(empty_database, "0008")
    assert asyncio.run(_reloptions(empty_database)) == EXPECTED
