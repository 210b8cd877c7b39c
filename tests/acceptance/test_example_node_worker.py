"""A worker in another language: the Node.js example, over plain HTTP, against a real ``jobq serve``."""

from __future__ import annotations

import os
import signal
from typing import Any

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.acceptance.helpers import requests_served
from tests.polling import poll_until
from tests.processes import REPO_ROOT, JobqServers, ProcessRegistry

pytestmark = pytest.mark.acceptance

WORKER = REPO_ROOT / "examples" / "node_worker" / "worker.mjs"
QUEUE = "node-reverse"
WORDS = ["hello", "jobq", "racecar", "", "été à Zürich", "🙂 emoji", "a b c", "x" * 1000]
TERMINAL = {"succeeded", "dead", "cancelled"}


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JOBQ_", "NODE_"))}
    env.update(extra)
    return env


async def test_node_worker_reverses_strings_kills_unknown_types_and_stops_on_sigterm(
    jobq_servers: JobqServers, clean_db: AsyncEngine, processes: ProcessRegistry, node_binary: str
) -> None:
    server = await jobq_servers.start()
    # A 20 s long-poll: the worker is parked in a claim when the jobs arrive, and must cut that
    # wait short on SIGTERM.
    worker = processes.spawn(
        "node-worker",
        [node_binary, str(WORKER), QUEUE],
        _env(JOBQ_URL=server.url, JOBQ_WAIT_SECONDS="20", JOBQ_MAX_JOBS="3"),
    )
    async with httpx.AsyncClient(base_url=server.url, timeout=10) as http:
        body = {
            "jobs": [{"queue": QUEUE, "type": "reverse", "payload": w} for w in WORDS]
            + [
                {"queue": QUEUE, "type": "translate", "payload": "hello"},
                {"queue": QUEUE, "type": "reverse", "payload": {"not": "a string"}},
            ]
        }
        r = await http.post("/v1/jobs/batch", json=body)
        assert r.status_code == 201, r.text
        ids = [job["id"] for job in r.json()["jobs"]]
        jobs: dict[int, dict[str, Any]] = {}

        async def all_finished() -> bool:
            assert worker.process.poll() is None, f"node worker exited:\n{worker.log_text()}"
            for job_id in ids:
                answer = await http.get(f"/v1/jobs/{job_id}")
                assert answer.status_code == 200, answer.text
                jobs[job_id] = answer.json()
            return all(job["status"] in TERMINAL for job in jobs.values())

        await poll_until(all_finished, within=20, what="the node worker to finish every job")
        metrics = (await http.get("/metrics")).text

    # Four batches of at most 3: each complete claimed the next batch (claim_next); the last
    # batch failed whole, so a claim followed it (and the worker parks in another since).
    claims, completes = (
        requests_served(metrics, "/v1/claim"),
        requests_served(metrics, "/v1/complete"),
    )
    assert completes >= 3 and claims <= 3, (claims, completes)

    *reversed_ids, unknown_id, bad_payload_id = ids
    for job_id, word in zip(reversed_ids, WORDS, strict=True):
        job = jobs[job_id]
        assert job["status"] == "succeeded", job
        assert job["result"] == word[::-1], (word, job["result"])
        assert job["attempts"] == 1, job
    # Not retryable: dead after the first attempt, with the worker's reason on record.
    unknown = jobs[unknown_id]
    assert (unknown["status"], unknown["attempts"]) == ("dead", 1), unknown
    assert "translate" in unknown["last_error"], unknown
    bad = jobs[bad_payload_id]
    assert (bad["status"], bad["attempts"]) == ("dead", 1), bad
    assert "string" in bad["last_error"], bad

    worker.send_signal(signal.SIGTERM)
    # Well inside the 20 s long-poll: the worker aborts its parked claim instead of waiting it out.
    code = await worker.wait_exit(within=5)
    assert code == 0, f"node worker exit status {code}:\n{worker.log_text()}"
    assert "SIGTERM: stopping" in worker.log_text()
