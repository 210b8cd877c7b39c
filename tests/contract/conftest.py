"""Fixtures of the clients' contract suite: each client's driver built once, one service per module.

The suite's service is a real ``jobq serve`` that logs every request (the scenarios read from its
access log which calls a worker made) and retries quickly (a reaped lease is due again at once).
A second service on a database of its own has API keys, so authentication is on there only.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from app.migrations import upgrade
from tests.conftest import create_database, drop_database
from tests.contract.drivers import CLIENTS, Driver, build_driver
from tests.processes import JobqServer, JobqServers, ProcessRegistry, clean_environment

pytestmark = pytest.mark.acceptance

SERVICE_ENV = {
    "JOBQ_LOG_ACCESS": "all",
    "JOBQ_BACKOFF_BASE_SECONDS": "0.05",
    "JOBQ_BACKOFF_CAP_SECONDS": "0.1",
    "JOBQ_REAPER_INTERVAL_SECONDS": "0.2",
}


@pytest.fixture(scope="session")
def driver_argvs() -> dict[str, list[str]]:
    """Each client's driver argv, built the first time a test asks for it."""
    return {}


@pytest.fixture(scope="module")
def service_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProcessRegistry]:
    """The processes that outlive one test: the suite's services."""
    registry = ProcessRegistry(tmp_path_factory.mktemp("contract-services"))
    try:
        yield registry
    finally:
        registry.stop_all()


@pytest.fixture(scope="module")
async def service(service_registry: ProcessRegistry, database_url: str) -> JobqServer:
    """The suite's ``jobq serve`` (authentication off: loopback, no keys)."""
    return await JobqServers(service_registry, database_url).start(SERVICE_ENV)


@dataclass
class KeyedService:
    """A service with authentication on, and one key of each role the scenarios use."""

    server: JobqServer
    producer_key: str
    viewer_key: str


def make_key(database_url: str, role: str) -> str:
    """``jobq keys create``: the secret it prints."""
    done = subprocess.run(
        [sys.executable, "-m", "app.cli", "keys", "create", "--role", role, "--name", role],
        env=clean_environment({"DATABASE_URL": database_url}),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
async def keyed_service(
    service_registry: ProcessRegistry, pg_server_url: str
) -> AsyncIterator[KeyedService]:
    """A ``jobq serve`` on a database of its own that has keys."""
    url = await asyncio.to_thread(create_database, pg_server_url, "jobq_contract_keys")
    try:
        await asyncio.to_thread(upgrade, url)
        producer = await asyncio.to_thread(make_key, url, "producer")
        viewer = await asyncio.to_thread(make_key, url, "viewer")
        server = await JobqServers(service_registry, url).start(SERVICE_ENV)
        yield KeyedService(server, producer, viewer)
        server.stop()
    finally:
        await asyncio.to_thread(drop_database, pg_server_url, url)


@pytest.fixture(params=CLIENTS)
def driver(
    request: pytest.FixtureRequest,
    driver_argvs: dict[str, list[str]],
    tmp_path_factory: pytest.TempPathFactory,
    processes: ProcessRegistry,
    service: JobqServer,
) -> Driver:
    """One client's driver on the suite's service, with a queue of the test's own."""
    client: str = request.param
    if client not in driver_argvs:
        driver_argvs[client] = build_driver(client, Path(tmp_path_factory.mktemp(client)))
    queue = f"contract-{client}-{uuid.uuid4().hex[:8]}"
    return Driver(client, driver_argvs[client], processes, service.url, queue)
