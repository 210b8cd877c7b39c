"""The audit trail (``/dashboard/audit``), newest first, filtered by action and actor."""

from __future__ import annotations

import re
from dataclasses import asdict
from typing import Any
from urllib.parse import urlencode

from fastapi import Response

from app.api.audit_models import AuditAction
from app.api.filters import is_cursor
from app.dashboard.base import PAGE_SIZE, PREFIX, input_problem
from app.dashboard.board import OBSERVE, Call, Route
from app.errors import InvalidInput

ACTOR_MAX_CHARS = 255
_ACTION_PATTERN = re.compile(r"^[a-z][a-z0-9_.]{0,63}$")


async def audit(call: Call) -> Response:
    """The audit trail, newest first, with keyset paging."""
    params = call.request.query_params
    errors: list[str] = []
    action = params.get("action") or None
    if action is not None and not _ACTION_PATTERN.fullmatch(action):
        errors.append("Unknown action.")
        action = None
    actor = params.get("actor") or None
    if actor is not None and (len(actor) > ACTOR_MAX_CHARS or "\x00" in actor):
        errors.append(f"An actor is at most {ACTOR_MAX_CHARS} characters, without NUL.")
        actor = None
    after = params.get("after") or None
    if after is not None and not is_cursor(after):
        errors.append("The page position (after) is malformed.")
        after = None
    entries: list[dict[str, Any]] = []
    next_cursor = None
    if not errors:
        try:
            rows, next_cursor = await call.services.ops.audit_list(
                action=action,
                actor=actor,
                limit=PAGE_SIZE,
                after=after,
                queue_patterns=call.caller.principal.like_patterns(),
            )
            entries = [asdict(r) for r in rows]
        except InvalidInput as exc:
            errors.append(input_problem(exc))
    query = {k: v for k, v in (("action", action), ("actor", actor)) if v}
    return call.page(
        "audit",
        nav="audit",
        status=400 if errors else 200,
        entries=entries,
        errors=errors,
        action=action or "",
        actor=actor or "",
        after=after or "",
        actions=[a.value for a in AuditAction],
        query=urlencode(query),
        next_query=urlencode({**query, "after": next_cursor}) if next_cursor else "",
    )


ROUTES = (
    Route("GET", f"{PREFIX}/audit", audit, OBSERVE),
    Route("GET", f"{PREFIX}/fragments/audit", audit, OBSERVE),
)
