"""A minimal jobq worker in plain HTTP (httpx only): claim, do the work, complete or fail.

    JOBQ_URL=http://127.0.0.1:8000 python examples/http_worker.py emails

It shows the wire protocol any language can speak; the reference client with heartbeats,
checkpoints and graceful release is ``jobq_client``. A busy worker makes one request per batch:
each ``complete`` asks for the next jobs (``claim_next``) and its answer carries them
(``claimed``); only an idle worker sends ``POST /v1/claim``, which long-polls.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import time
from typing import Any

import httpx

stopping = False
MAX_JOBS = 10


def _stop(*_: Any) -> None:
    global stopping
    stopping = True


def handle(job: dict[str, Any]) -> Any:
    """The work: here, echo the payload back as the result."""
    return {"echo": job["payload"], "type": job["type"]}


def main() -> int:
    base = os.environ.get("JOBQ_URL", "http://127.0.0.1:8000")
    queues = sys.argv[1:] or ["default"]
    worker_id = f"{socket.gethostname()}:{os.getpid()}"
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    key = os.environ.get("JOBQ_API_KEY")  # a worker key, once the service has keys
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    # The next jobs, asked for with each complete: no wait, so the complete answers at once.
    claim_next = {"queues": queues, "max_jobs": MAX_JOBS}
    jobs: list[dict[str, Any]] = []
    with httpx.Client(base_url=base, timeout=30, headers=headers) as http:
        while not stopping:
            if not jobs:
                try:
                    r = http.post(
                        "/v1/claim",
                        json={
                            "worker_id": worker_id,
                            "queues": queues,
                            "max_jobs": MAX_JOBS,
                            "wait_seconds": 5,
                        },
                    )
                    r.raise_for_status()
                except httpx.HTTPError as exc:
                    print(f"claim failed: {exc}; retrying", flush=True)
                    time.sleep(1)
                    continue
                jobs = r.json()["jobs"]
                continue  # nothing after a 5 s wait: ask again (or stop)
            done, failed = [], []
            for job in jobs:
                ref = {"job_id": job["id"], "lease_id": job["lease_id"]}
                try:
                    done.append({**ref, "result": handle(job)})
                except Exception as exc:  # noqa: BLE001 - any handler error fails the attempt
                    failed.append({**ref, "error": f"{type(exc).__name__}: {exc}"})
            jobs = []
            try:
                if failed:
                    http.post("/v1/fail", json={"worker_id": worker_id, "leases": failed})
                if done:
                    body: dict[str, Any] = {"worker_id": worker_id, "leases": done}
                    if not stopping:
                        body["claim_next"] = claim_next
                    answer = http.post("/v1/complete", json=body).json()
                    if answer.get("claimed") is not None:
                        jobs = answer["claimed"]["jobs"]
            except httpx.HTTPError as exc:
                # The leases run out and the jobs run again: handlers must be idempotent.
                print(f"settle failed: {exc}", flush=True)
            print(f"{worker_id}: {len(done)} done, {len(failed)} failed", flush=True)
        if jobs:  # claimed with the last complete, as the signal came: give them back now
            leases = [{"job_id": job["id"], "lease_id": job["lease_id"]} for job in jobs]
            http.post("/v1/release", json={"worker_id": worker_id, "leases": leases})
    return 0


if __name__ == "__main__":
    sys.exit(main())
