"""A worker module for ``jobq worker tests.acceptance.chunked_worker:worker``: a job done in chunks.

Each chunk's progress is saved as the job's checkpoint, so a stopped or crashed worker's
successor carries on from the last saved chunk.
"""

from __future__ import annotations

import asyncio
from typing import Any

from jobq_client import JobContext, Worker

QUEUE = "chunked"
LEASE_SECONDS = 60  # long on purpose: a release that waited for lease expiry would be obvious

worker = Worker(
    queues=[QUEUE],
    concurrency=1,
    lease_seconds=LEASE_SECONDS,
    grace_seconds=20,
    wait_seconds=5,
)


@worker.handler("chunked")
async def chunked(ctx: JobContext) -> Any:
    """Processes ``payload["chunks"]`` chunks, saving ``{"next": n}`` after each one."""
    total: int = ctx.payload["chunks"]
    pause: float = ctx.payload["chunk_seconds"]
    start: int = (ctx.checkpoint or {}).get("next", 0)
    for n in range(start, total):
        await asyncio.sleep(pause)  # the chunk's work
        await ctx.save_checkpoint({"next": n + 1}, progress={"done": n + 1, "total": total})
    return {"chunks": total, "resumed_from": start}
