"""Secure by default: with no keys, only loopback; a public address needs a key or --insecure."""

from __future__ import annotations

import httpx
from sqlalchemy.ext.asyncio import AsyncEngine

from app.auth.keys import Role
from app.cli import is_loopback
from tests.keys import make_key
from tests.processes import JobqServer, ProcessRegistry, clean_environment, free_port


def _server(processes: ProcessRegistry, database_url: str, *args: str) -> JobqServer:
    name = f"jobq-public-{len(processes.children) + 1}"
    server = JobqServer(
        name=name,
        port=free_port(),
        env=clean_environment({"DATABASE_URL": database_url}),
        log_path=processes._log_path(name),
        extra_args=["--host", "0.0.0.0", *args],  # the last --host wins
    )
    processes.children.append(server)
    return server


async def test_a_public_address_without_keys_is_refused_naming_insecure(
    processes: ProcessRegistry, database_url: str, clean_db: AsyncEngine
) -> None:
    server = _server(processes, database_url)
    assert await server.wait_exit(within=60) == 2
    log = server.log_text()
    assert "refusing to serve 0.0.0.0" in log and "--insecure" in log


async def test_insecure_insists_and_says_so(
    processes: ProcessRegistry, database_url: str, clean_db: AsyncEngine
) -> None:
    server = _server(processes, database_url, "--insecure")
    await server.wait_ready()
    async with httpx.AsyncClient(base_url=server.url) as client:
        assert (await client.get("/v1/queues")).status_code == 200  # no key needed
    assert "WITHOUT authentication" in server.log_text()


async def test_with_a_key_a_public_address_serves_and_requires_keys(
    processes: ProcessRegistry, database_url: str, clean_db: AsyncEngine
) -> None:
    await make_key(clean_db, "admin", Role.ADMIN)
    server = _server(processes, database_url)
    await server.wait_ready()
    async with httpx.AsyncClient(base_url=server.url) as client:
        refused = await client.get("/v1/queues")
        assert refused.status_code == 401
        assert refused.headers["www-authenticate"].startswith("Bearer")
        health = await client.get("/healthz")
        assert health.status_code == 200 and health.json() == {"status": "ok"}


async def test_loopback_without_keys_serves_and_logs_that_authentication_is_off(
    processes: ProcessRegistry, database_url: str, clean_db: AsyncEngine
) -> None:
    name = "jobq-loopback"
    server = JobqServer(
        name=name,
        port=free_port(),
        env=clean_environment({"DATABASE_URL": database_url}),
        log_path=processes._log_path(name),
    )
    processes.children.append(server)
    await server.wait_ready()
    assert server.log_text().count("authentication is off") == 1


def test_what_counts_as_loopback() -> None:
    for host in ("127.0.0.1", "127.0.0.2", "::1", "[::1]", "localhost"):
        assert is_loopback(host), host
    for host in ("0.0.0.0", "::", "10.0.0.5", "example.com", "192.168.1.1"):
        assert not is_loopback(host), host
