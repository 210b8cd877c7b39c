"""A minimal jobq worker in plain HTTP (httpx only): claim, do the work, complete or fail.

    JOBQ_URL=http://127.0.0.1:8000 python examples/http_worker.py emails

It shows the wire protocol any language can speak; the reference client with heartbeats,
checkpoints and graceful release is ``jobq_client``.
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
    with httpx.Client(base_url=base, timeout=30, headers=headers) as http:
        while not stopping:
            try:
                r = http.post(
                    "/v1/claim",
                    json={
                        "worker_id": worker_id,
                        "queues": queues,
                        "max_jobs": 10,
                        "wait_seconds": 5,
                    },
                )
                r.raise_for_status()
            except httpx.HTTPError as exc:
                print(f"claim failed: {exc}; retrying", flush=True)
                time.sleep(1)
                continue
            jobs = r.json()["jobs"]
            if not jobs:
                time.sleep(0.5)  # the service answered at once: wait a little before asking again
                continue
            done, failed = [], []
            for job in jobs:
                ref = {"job_id": job["id"], "lease_id": job["lease_id"]}
                try:
                    done.append({**ref, "result": handle(job)})
                except Exception as exc:  # noqa: BLE001 - any handler error fails the attempt
                    failed.append({**ref, "error": f"{type(exc).__name__}: {exc}"})
            if done:
                http.post("/v1/complete", json={"worker_id": worker_id, "leases": done})
            if failed:
                http.post("/v1/fail", json={"worker_id": worker_id, "leases": failed})
            print(f"{worker_id}: {len(done)} done, {len(failed)} failed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
