"""The overview (``/dashboard``): queues with counts per state and the last hour's throughput."""

from __future__ import annotations

from dataclasses import asdict
from datetime import UTC, datetime

from fastapi import Response

from app.dashboard import views
from app.dashboard.base import PREFIX, job_id, safe_next
from app.dashboard.board import OBSERVE, OPERATE, Call, Route
from app.dashboard.session import Flash
from app.errors import Forbidden

THROUGHPUT_MINUTES = 60
# The overview lists this many set-aside jobs (GET /v1/maintenance/set-aside pages through all).
SET_ASIDE_SHOWN = 50


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
    set_aside = await call.services.upkeep.set_aside(
        limit=SET_ASIDE_SHOWN, queue_patterns=call.caller.principal.like_patterns()
    )
    return call.page(
        "overview",
        nav="overview",
        queues=queues,
        chart=chart,
        set_aside=[asdict(s) for s in set_aside],
        set_aside_next=PREFIX,
    )


async def put_back(call: Call) -> Response:
    """Puts a job a maintenance loop set aside back into its batches; back to where it came
    from (the overview, or the job's page) with the outcome."""
    params = call.request.path_params
    loop = params.get("loop", "")
    found = job_id(params.get("job_id", ""))
    principal = call.caller.principal
    for row in await call.services.upkeep.set_aside_of_job(found):
        if row.loop == loop and row.queue is not None and not principal.covers(row.queue):
            raise Forbidden(f"Key {principal.name!r} is not scoped to queue {row.queue!r}.")
    removed = await call.services.upkeep.put_back(
        loop=loop, job_id=found, actor=principal.name, actor_key_id=principal.key_id
    )
    flash = (
        Flash("ok", f"Put back: the {loop} tries job {found} again on its next pass")
        if removed is not None
        else Flash("error", f"Job {found} is not set aside by the {loop}")
    )
    return call.redirect(safe_next(call.form.get("next")) or PREFIX, flash)


ROUTES = (
    Route("GET", PREFIX, overview, OBSERVE),
    Route("GET", f"{PREFIX}/fragments/overview", overview, OBSERVE),
    Route(
        "POST",
        PREFIX + "/maintenance/set-aside/{loop}/{job_id}/put-back",
        put_back,
        OPERATE,
        action=True,
    ),
)
