"""`jobq serve --workers 2`: two server processes on one port, supervised, waking each other."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.polling import poll_until
from tests.processes import JobqServer, ProcessRegistry, clean_environment, free_port

pytestmark = pytest.mark.acceptance


def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in path.read_text().split()] if path.exists() else []


async def test_two_processes_share_the_port_wake_each_other_and_are_supervised(
    processes: ProcessRegistry, database_url: str, clean_db: AsyncEngine, tmp_path: Path
) -> None:
    # A 20 s backstop: a long-poll answered sooner was woken by a real notification.
    env = clean_environment({"DATABASE_URL": database_url, "JOBQ_LONGPOLL_BACKSTOP_SECONDS": "20"})
    server = JobqServer(
        name="workers",
        port=free_port(),
        env=env,
        log_path=tmp_path / "workers.log",
        extra_args=["--workers", "2"],
    )
    processes.children.append(server)
    await server.wait_ready(60)
    await poll_until(lambda: len(_children(server.pid)) == 2, within=20, what="two children")
    first = set(_children(server.pid))

    # Each request opens its own connection, so the kernel spreads them over both processes.
    async def fresh(method: str, path: str, **kwargs: object) -> httpx.Response:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
            return await client.request(method, path, **kwargs)  # type: ignore[arg-type]

    for _ in range(6):
        started = time.monotonic()
        waiting = asyncio.ensure_future(
            fresh("POST", "/v1/claim", json={"worker_id": "w", "queues": ["x"], "wait_seconds": 15})
        )
        await poll_until(
            lambda: _waiting_somewhere(server.url), within=10, what="the claim to park"
        )
        r = await fresh("POST", "/v1/jobs", json={"queue": "x", "type": "t"})
        assert r.status_code == 201
        answer = await asyncio.wait_for(waiting, 10)
        assert len(answer.json()["jobs"]) == 1 and time.monotonic() - started < 10

    # A child killed outright is replaced.
    victim = sorted(first)[0]
    os.kill(victim, signal.SIGKILL)
    await poll_until(
        lambda: len(_children(server.pid)) == 2 and victim not in _children(server.pid),
        within=30,
        what="a new child",
    )
    await server.wait_ready(60)

    server.send_signal(signal.SIGTERM)
    assert await server.wait_exit(30) == 0


async def _waiting_somewhere(url: str) -> bool:
    # Either process may hold the claim; ask until one says so (a fresh connection each time).
    for _ in range(4):
        async with httpx.AsyncClient(base_url=url, timeout=5) as client:
            if "jobq_claims_waiting 1.0" in (await client.get("/metrics")).text:
                return True
    return False
