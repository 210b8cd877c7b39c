"""Workers (``/dashboard/workers``): who holds what right now."""

from __future__ import annotations

from dataclasses import asdict

from fastapi import Response

from app.dashboard.base import PREFIX
from app.dashboard.board import OBSERVE, Call, Route

# Job links shown per worker; the rest are counted.
WORKER_JOB_LINKS = 20


async def workers(call: Call) -> Response:
    """Who holds what: workers with leases, their keys, jobs, last heartbeat and next expiry."""
    rows = await call.services.ops.workers(queue_patterns=call.caller.principal.like_patterns())
    return call.page(
        "workers", nav="workers", workers=[asdict(r) for r in rows], links=WORKER_JOB_LINKS
    )


ROUTES = (
    Route("GET", f"{PREFIX}/workers", workers, OBSERVE),
    Route("GET", f"{PREFIX}/fragments/workers", workers, OBSERVE),
)
