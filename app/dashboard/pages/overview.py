"""The overview (``/dashboard``): queues with counts per state and the last hour's throughput."""

from __future__ import annotations

from dataclasses import asdict
from datetime import UTC, datetime

from fastapi import Response

from app.dashboard import views
from app.dashboard.base import PREFIX
from app.dashboard.board import OBSERVE, Call, Route

THROUGHPUT_MINUTES = 60


async def overview(call: Call) -> Response:
    """Queues with counts per state (each a link to those jobs), oldest pending age, paused flag,
    a warning where jobs wait and no live worker polls the queue, and the last hour's throughput."""
    covers = call.caller.principal.covers
    queues = [asdict(r) for r in await call.services.ops.queue_stats() if covers(r.name)]
    live = await call.services.workers.live_per_queue([q["name"] for q in queues])
    for q in queues:
        q["live_workers"] = live.get(q["name"], 0)
    throughput = await call.services.ops.queue_throughput(minutes=THROUGHPUT_MINUTES)
    chart = views.throughput_chart(
        [asdict(r) for r in throughput],
        now=datetime.now(UTC),
        visible=covers,
        minutes=THROUGHPUT_MINUTES,
    )
    return call.page("overview", nav="overview", queues=queues, chart=chart)


ROUTES = (
    Route("GET", PREFIX, overview, OBSERVE),
    Route("GET", f"{PREFIX}/fragments/overview", overview, OBSERVE),
)
