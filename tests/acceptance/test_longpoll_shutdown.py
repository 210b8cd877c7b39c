"""SIGTERM on a real `jobq serve` answers its parked long-polls at once, then exits cleanly."""

from __future__ import annotations

import asyncio
import signal
import time

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.polling import poll_until
from tests.processes import JobqServers

pytestmark = pytest.mark.acceptance

PARKED = 20


async def test_sigterm_answers_parked_claims_promptly_and_exits_zero(
    jobq_servers: JobqServers, clean_db: AsyncEngine
) -> None:
    server = await jobq_servers.start()
    limits = httpx.Limits(max_connections=PARKED + 5)
    async with httpx.AsyncClient(base_url=server.url, timeout=30, limits=limits) as client:

        async def park(n: int) -> tuple[int, list[object], float]:
            body = {"worker_id": f"w{n}", "queues": ["idle"], "wait_seconds": 20}
            r = await client.post("/v1/claim", json=body)
            return r.status_code, r.json()["jobs"], time.monotonic()

        parked = [asyncio.create_task(park(n)) for n in range(PARKED)]

        async def all_parked() -> bool:
            scrape = (await client.get("/metrics")).text
            return f"jobq_claims_waiting {float(PARKED)}" in scrape

        await poll_until(all_parked, within=10, what=f"{PARKED} claims to park")
        assert not [t for t in parked if t.done()], "a claim returned before any job or signal"
        signalled = time.monotonic()
        server.send_signal(signal.SIGTERM)
        answers = await asyncio.wait_for(asyncio.gather(*parked), 10)
    assert all(code == 200 and jobs == [] for code, jobs, _ in answers), answers
    slowest = max(at for _, _, at in answers) - signalled
    assert slowest < 1.0, f"parked claims took {slowest:.2f}s to answer after SIGTERM"
    code = await server.wait_exit(15)
    assert code == 0, f"exit status {code}"
