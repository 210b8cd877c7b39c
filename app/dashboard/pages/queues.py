"""The overview's queue actions: pause and resume a queue, then back to the overview."""

from __future__ import annotations

from fastapi import Response

from app.api.filters import is_queue_name
from app.dashboard.base import PREFIX
from app.dashboard.board import OPERATE, Call, Route
from app.dashboard.session import Flash
from app.errors import Forbidden, InvalidInput, NotFound


async def queue_pause(call: Call) -> Response:
    """Pauses a queue (claims skip it); back to the overview with the outcome."""
    return await _queue_action(call, paused=True)


async def queue_resume(call: Call) -> Response:
    """Resumes a queue; back to the overview with the outcome."""
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
    return call.redirect(PREFIX, Flash("ok", f"{done} queue {name}"))


ROUTES = (
    Route("POST", PREFIX + "/queues/{name}/pause", queue_pause, OPERATE, action=True),
    Route("POST", PREFIX + "/queues/{name}/resume", queue_resume, OPERATE, action=True),
)
