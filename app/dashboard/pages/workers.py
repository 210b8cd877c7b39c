"""Workers (``/dashboard/workers``): who works on what, and who is idle, right now."""

from __future__ import annotations

from dataclasses import asdict

from fastapi import Response

from app.dashboard.base import PREFIX
from app.dashboard.board import OBSERVE, Call, Route

# Job links shown per worker; the rest are counted.
WORKER_JOB_LINKS = 20


async def workers(call: Call) -> Response:
    """Workers seen in the last ten minutes and every lease holder: live or not, the queues they
    poll, the jobs they hold with type and running time, first and last seen."""
    rows = await call.services.workers.overview(
        queue_patterns=call.caller.principal.like_patterns()
    )
    shown = []
    for r in rows:
        row = asdict(r)
        row["held"] = [
            {"id": i, "type": t, "started_at": s}
            for i, t, s in zip(r.job_ids, r.job_types, r.job_started, strict=False)
        ]
        shown.append(row)
    return call.page("workers", nav="workers", workers=shown, links=WORKER_JOB_LINKS)


ROUTES = (
    Route("GET", f"{PREFIX}/workers", workers, OBSERVE),
    Route("GET", f"{PREFIX}/fragments/workers", workers, OBSERVE),
)
