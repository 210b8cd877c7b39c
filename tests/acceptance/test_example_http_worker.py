"""The plain-HTTP Python example (examples/http_worker.py) against a real ``jobq serve``: it
completes with ``claim_next``, so a busy worker makes one request per batch."""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.acceptance.helpers import requests_served
from tests.polling import poll_until
from tests.processes import REPO_ROOT, JobqServers, ProcessRegistry

pytestmark = pytest.mark.acceptance

WORKER = REPO_ROOT / "examples" / "http_worker.py"
QUEUE = "echo"
JOBS = 45  # more than one claim of 10: the later batches come with the completes


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBQ_")}
    env.update(extra)
    return env


async def test_http_worker_echoes_every_job_claims_with_its_completes_and_stops_on_sigterm(
    jobq_servers: JobqServers, clean_db: AsyncEngine, processes: ProcessRegistry
) -> None:
    server = await jobq_servers.start()
    async with httpx.AsyncClient(base_url=server.url, timeout=10) as http:
        body = {"jobs": [{"queue": QUEUE, "type": "echo", "payload": n} for n in range(JOBS)]}
        r = await http.post("/v1/jobs/batch?answer=ids", json=body)
        assert r.status_code == 201, r.text
        ids = r.json()["ids"]
        worker = processes.spawn(
            "http-worker", [sys.executable, str(WORKER), QUEUE], _env(JOBQ_URL=server.url)
        )
        jobs: dict[int, dict[str, Any]] = {}

        async def all_succeeded() -> bool:
            assert worker.process.poll() is None, f"worker exited:\n{worker.log_text()}"
            r = await http.get("/v1/jobs", params={"queue": QUEUE, "limit": 100})
            assert r.status_code == 200, r.text
            jobs.update((job["id"], job) for job in r.json()["jobs"])
            return all(jobs.get(i, {}).get("status") == "succeeded" for i in ids)

        await poll_until(all_succeeded, within=30, what="the worker to complete every job")
        metrics = (await http.get("/metrics")).text

    for n, job_id in enumerate(ids):
        job = jobs[job_id]
        assert job["result"] == {"echo": n, "type": "echo"}, job
        assert job["attempts"] == 1, job
    # Five batches of at most 10: the first claimed alone, the next ones by the completes before
    # them; the only other claims are the idle worker's long polls since.
    claims, completes = (
        requests_served(metrics, "/v1/claim"),
        requests_served(metrics, "/v1/complete"),
    )
    assert completes >= JOBS // 10 and claims <= 3, (claims, completes)
    async with clean_db.connect() as conn:
        workers = (
            await conn.execute(text("SELECT count(DISTINCT worker_id) FROM jobs"))
        ).scalar_one()
    assert workers == 1

    worker.send_signal(signal.SIGTERM)
    # Parked in a 5 s long-poll claim: it stops once that returns.
    code = await worker.wait_exit(within=10)
    assert code == 0, worker.log_text()
