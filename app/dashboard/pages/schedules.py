"""Schedules (``/dashboard/schedules``): periodic schedules in name order, with keyset paging;
admins pause, resume, delete and trigger them (as the API does, within the key's scopes)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any
from urllib.parse import urlencode

from fastapi import Response

from app.dashboard.base import PAGE_SIZE, PREFIX
from app.dashboard.board import OBSERVE, OPERATE, Call, Route
from app.dashboard.session import Flash
from app.domain.cron import SCHEDULE_NAME_PATTERN
from app.errors import Forbidden, NotFound


async def schedules(call: Call) -> Response:
    """Periodic schedules in name order: timing, zone, queue and type, next and last run."""
    after = call.request.query_params.get("after") or None
    errors: list[str] = []
    if after is not None and not SCHEDULE_NAME_PATTERN.fullmatch(after):
        errors.append("The page position (after) is malformed.")
        after = None
    rows: list[Any] = []
    next_cursor = None
    if not errors:
        rows, next_cursor = await call.services.schedules.list_page(
            limit=PAGE_SIZE,
            after=after,
            queue_patterns=call.caller.principal.like_patterns(),
        )
    paused_queues = {q.name for q in await call.services.ops.queue_stats() if q.paused}
    return call.page(
        "schedules",
        nav="schedules",
        status=400 if errors else 200,
        schedules=[{**asdict(r), "queue_paused": r.queue in paused_queues} for r in rows],
        errors=errors,
        after=after or "",
        next_query=urlencode({"after": next_cursor}) if next_cursor else "",
    )


async def _act(call: Call, verb: str) -> Response:
    name = call.request.path_params.get("name", "")
    principal = call.caller.principal
    allowed = principal.covers if principal.scoped else None
    try:
        if verb == "delete":
            await call.services.schedules.delete(
                name, actor=principal.name, actor_key_id=principal.key_id, allowed=allowed
            )
            done = f"Deleted schedule {name}; the jobs it enqueued stay"
        else:
            await call.services.schedules.set_paused(
                name,
                paused=verb == "pause",
                actor=principal.name,
                actor_key_id=principal.key_id,
                allowed=allowed,
            )
            done = f"{'Paused' if verb == 'pause' else 'Resumed'} schedule {name}"
    except (NotFound, Forbidden) as exc:
        return call.redirect(f"{PREFIX}/schedules", Flash("error", exc.detail))
    return call.redirect(f"{PREFIX}/schedules", Flash("ok", done))


async def schedule_trigger(call: Call) -> Response:
    """Enqueues one job from a schedule's template now (its next run stays); back to the list
    with a link to the job."""
    name = call.request.path_params.get("name", "")
    principal = call.caller.principal
    try:
        job = await call.services.schedule_trigger.trigger(
            name,
            actor=principal.name,
            actor_key_id=principal.key_id,
            queue_patterns=principal.like_patterns(),
        )
    except (NotFound, Forbidden) as exc:
        return call.redirect(f"{PREFIX}/schedules", Flash("error", exc.detail))
    return call.redirect(
        f"{PREFIX}/schedules", Flash("ok", f"Triggered schedule {name}", job_id=job.id)
    )


async def schedule_pause(call: Call) -> Response:
    """Pauses one schedule; back to the list with the outcome."""
    return await _act(call, "pause")


async def schedule_resume(call: Call) -> Response:
    """Resumes one schedule from its first run after now; back to the list."""
    return await _act(call, "resume")


async def schedule_delete(call: Call) -> Response:
    """Deletes one schedule (its jobs stay); back to the list."""
    return await _act(call, "delete")


ROUTES = (
    Route("GET", f"{PREFIX}/schedules", schedules, OBSERVE),
    Route("GET", f"{PREFIX}/fragments/schedules", schedules, OBSERVE),
    Route("POST", f"{PREFIX}/schedules/{{name}}/pause", schedule_pause, OPERATE, action=True),
    Route("POST", f"{PREFIX}/schedules/{{name}}/resume", schedule_resume, OPERATE, action=True),
    Route("POST", f"{PREFIX}/schedules/{{name}}/delete", schedule_delete, OPERATE, action=True),
    Route("POST", f"{PREFIX}/schedules/{{name}}/trigger", schedule_trigger, OPERATE, action=True),
)
