"""The compose stack's example worker: a ``jobq_client.Worker`` that echoes each job's payload.

    jobq worker echo_worker:worker      # JOBQ_URL and JOBQ_API_KEY from the environment

Queues from ``ECHO_QUEUES`` (comma-separated, default ``default``). Enqueue through the proxy
with the admin key the ``keys`` service printed::

    curl -H "Authorization: Bearer $KEY" -H 'Content-Type: application/json' \\
        -d '{"queue": "default", "type": "echo", "payload": {"hello": "world"}}' \\
        http://127.0.0.1:8000/v1/jobs
"""

from __future__ import annotations

import os
from typing import Any

from jobq_client import JobContext, Worker

worker = Worker(
    os.environ.get("JOBQ_URL", "http://127.0.0.1:8000"),
    queues=[q.strip() for q in os.environ.get("ECHO_QUEUES", "default").split(",") if q.strip()],
    concurrency=4,
)


@worker.handler("echo")
async def echo(ctx: JobContext) -> dict[str, Any]:
    """Answers the payload back as the job's result."""
    return {"echo": ctx.payload, "attempt": ctx.attempt}
