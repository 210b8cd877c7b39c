"""A revoked key is refused by every instance within a second; a new key works on all at once."""

from __future__ import annotations

import asyncio
import sys
import time

import httpx
from sqlalchemy.ext.asyncio import AsyncEngine

from app.auth.keys import Role
from tests.keys import bearer, make_key
from tests.polling import poll_until
from tests.processes import JobqServers, clean_environment

REVOCATION_DEADLINE_SECONDS = 1.0


async def _status(url: str, secret: str) -> int:
    async with httpx.AsyncClient(base_url=url, timeout=5.0) as client:
        return (await client.get("/v1/queues", headers=bearer(secret))).status_code


async def test_a_key_revoked_on_the_command_line_is_refused_by_a_second_instance_within_a_second(
    jobq_servers: JobqServers, database_url: str, clean_db: AsyncEngine
) -> None:
    first = await jobq_servers.start()
    second = await jobq_servers.start()
    secret = await make_key(clean_db, "ops-viewer", Role.VIEWER)
    # A key made after the instances started works on both at once (looked up on a miss).
    assert await _status(first.url, secret) == 200
    assert await _status(second.url, secret) == 200

    revoking = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "app.cli",
        "keys",
        "revoke",
        "ops-viewer",
        env=clean_environment({"DATABASE_URL": database_url}),
        stderr=asyncio.subprocess.PIPE,
    )
    _, stderr = await asyncio.wait_for(revoking.communicate(), timeout=60)
    assert revoking.returncode == 0, stderr.decode()
    committed = time.monotonic()
    for server in (first, second):

        async def refused(url: str = server.url) -> bool:
            return await _status(url, secret) == 401

        await poll_until(refused, within=5, what=f"{server.url} to refuse the key", interval=0.02)
        waited = time.monotonic() - committed
        assert waited <= REVOCATION_DEADLINE_SECONDS, (server.url, waited)
