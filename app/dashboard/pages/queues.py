"""A page per queue (``/dashboard/queues/{name}``) and the queue actions: pause and resume.

The queue's page shows its counts (each a link to those jobs), its switch and limit, the last
hour's outcomes per minute (the overview's chart, for this queue alone), and over the last hour
and the last 24 hours its failure rates, each with what it divides, and the p50 / p95 / p99 of
its jobs' wait and run time (``GET /v1/queues/{name}/stats`` answers the same figures).
"""

from __future__ import annotations

from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

from fastapi import Response

from app.api.filters import is_queue_name
from app.auth.keys import Principal
from app.dashboard import views
from app.dashboard.base import PREFIX
from app.dashboard.board import OBSERVE, OPERATE, Call, Route
from app.dashboard.pages.overview import THROUGHPUT_MINUTES
from app.dashboard.session import Flash
from app.domain.records import FlowLimitUse
from app.errors import Forbidden, InvalidInput, NotFound

# The windows of the queue's figures, in seconds, with their labels.
WINDOWS = ((3600, "last hour"), (86_400, "last 24 hours"))


def queue_url(name: str) -> str:
    """The page of queue ``name``."""
    return f"{PREFIX}/queues/{quote(name, safe='')}"


def _queue_name(call: Call) -> str:
    """The queue the path names, if the visitor's key covers it (else 404 or 403)."""
    name = str(call.request.path_params["name"])
    if not is_queue_name(name, call.settings.queue_name_max_chars):
        raise NotFound(f"queue {name[:40]!r} not found")
    principal = call.caller.principal
    if not principal.covers(name):
        raise Forbidden(f"Key {principal.name!r} is not scoped to queue {name!r}.")
    return name


def _queue_limit(rows: list[FlowLimitUse], name: str, principal: Principal) -> FlowLimitUse | None:
    """The queue limit that applies to ``name``: of the queue-scope patterns that match it, the
    longest, as the claim picks it. A scoped key sees limits named one by one only (as on the
    limits page and ``GET /v1/limits``)."""
    matching = [
        r
        for r in rows
        if r.scope == "queue"
        and views.glob_matches(r.pattern, name)
        and (not principal.scoped or "*" not in r.pattern)
    ]
    return max(matching, key=lambda r: len(r.pattern), default=None)


async def queue_page(call: Call) -> Response:
    """One queue: counts per state (each a link to those jobs), paused or not, its limit, the
    last hour's chart, and its failure rates and wait and run percentiles over two windows."""
    name = _queue_name(call)
    found = [r for r in await call.services.ops.queue_stats() if r.name == name]
    if not found:
        raise NotFound(f"queue {name} not found")
    queue: dict[str, Any] = asdict(found[0])
    live = await call.services.workers.live_per_queue([name])
    queue["live_workers"] = live.get(name, 0)
    figures = await call.services.history.queue_window_stats(
        name, windows=[seconds for seconds, _ in WINDOWS]
    )
    throughput = await call.services.ops.queue_throughput(minutes=THROUGHPUT_MINUTES)
    chart = views.throughput_chart(
        [asdict(r) for r in throughput],
        now=datetime.now(UTC),
        visible=lambda q: q == name,
        minutes=THROUGHPUT_MINUTES,
    )
    limit = _queue_limit(await call.services.limits.list_all(), name, call.caller.principal)
    windows = [
        {"seconds": seconds, "label": label, "row": row}
        for (seconds, label), row in zip(WINDOWS, figures, strict=True)
    ]
    return call.page(
        "queue",
        nav="overview",
        queue=queue,
        url=queue_url(name),
        chart=chart,
        windows=windows,
        limit=limit,
    )


async def queue_pause(call: Call) -> Response:
    """Pauses a queue (claims skip it); back to the overview, or the queue's page, with the outcome."""
    return await _queue_action(call, paused=True)


async def queue_resume(call: Call) -> Response:
    """Resumes a queue; back to the overview, or the queue's page, with the outcome."""
    return await _queue_action(call, paused=False)


async def _queue_action(call: Call, *, paused: bool) -> Response:
    name = call.request.path_params["name"]
    if not is_queue_name(name, call.settings.queue_name_max_chars):
        raise InvalidInput("That is not a queue name.")
    principal = call.caller.principal
    if not principal.covers(name):
        raise Forbidden(f"Key {principal.name!r} is not scoped to queue {name!r}.")
    try:
        await call.services.ops.set_paused(
            name, paused=paused, actor=principal.name, actor_key_id=principal.key_id
        )
    except NotFound:
        # Deleted since the overview was drawn; the overview shows it gone.
        return call.redirect(PREFIX, Flash("error", f"Queue {name} no longer exists"))
    done = "Paused" if paused else "Resumed"
    back = queue_url(name) if call.form.get("back") == "queue" else PREFIX
    return call.redirect(back, Flash("ok", f"{done} queue {name}"))


ROUTES = (
    Route("GET", PREFIX + "/queues/{name}", queue_page, OBSERVE),
    Route("GET", PREFIX + "/fragments/queues/{name}", queue_page, OBSERVE),
    Route("POST", PREFIX + "/queues/{name}/pause", queue_pause, OPERATE, action=True),
    Route("POST", PREFIX + "/queues/{name}/resume", queue_resume, OPERATE, action=True),
)
