"""Limits (``/dashboard/limits``): concurrency and rate limits with their running and held-back
jobs; admins with an unscoped key set and delete them (as ``PUT`` / ``DELETE /v1/limits``)."""

from __future__ import annotations

from dataclasses import asdict

from fastapi import Response
from pydantic import ValidationError

from app.api.flow_limits import LimitRequest
from app.dashboard.base import PREFIX
from app.dashboard.board import OBSERVE, OPERATE, Call, Route
from app.dashboard.session import Flash
from app.errors import NotFound

_LIMITS = f"{PREFIX}/limits"


async def limits(call: Call) -> Response:
    """Every limit a key may see: pattern, max running, rate, running and held back now."""
    principal = call.caller.principal
    rows = await call.services.limits.list_all()
    if principal.scoped:
        # As GET /v1/limits: only limits of the key's queues, named one by one.
        rows = [
            r
            for r in rows
            if r.scope == "queue" and "*" not in r.pattern and principal.covers(r.pattern)
        ]
    held = await call.services.limits.held_back() if rows else {}
    shown = [{**asdict(r), "held_back": held.get(r.id, 0)} for r in rows]
    return call.page("limits", nav="limits", limits=shown, can_change=not principal.scoped)


def _number(text: str, kind: type[int] | type[float]) -> int | float | None:
    text = text.strip()
    if not text:
        return None
    try:
        return kind(text)
    except ValueError:
        return None


async def limit_set(call: Call) -> Response:
    """Creates or replaces a limit from the form; back to the list with the outcome."""
    if call.caller.principal.scoped:
        raise call.refuse(403, "Limits need an admin key without queue scopes.")
    form = call.form
    rate_limit = _number(form.get("rate_limit", ""), int)
    per_seconds = _number(form.get("rate_per_seconds", ""), float)
    body = {
        "scope": form.get("scope", ""),
        "pattern": form.get("pattern", "").strip(),
        "max_running": _number(form.get("max_running", ""), int),
        "rate": {"limit": rate_limit, "per_seconds": per_seconds}
        if rate_limit is not None or per_seconds is not None
        else None,
    }
    try:
        request = LimitRequest.model_validate(body)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'limit'}: {e['msg']}" for e in exc.errors()
        )
        return call.redirect(_LIMITS, Flash("error", f"Not set: {problems}"))
    principal = call.caller.principal
    row = await call.services.limits.put(
        scope=request.scope,
        pattern=request.pattern,
        max_running=request.max_running,
        rate_limit=request.rate.limit if request.rate else None,
        rate_per_seconds=request.rate.per_seconds if request.rate else None,
        actor=principal.name,
        actor_key_id=principal.key_id,
    )
    verb = "Created" if row.created else "Updated"
    return call.redirect(_LIMITS, Flash("ok", f"{verb} the {row.scope} limit {row.pattern}"))


async def limit_delete(call: Call) -> Response:
    """Deletes one limit; back to the list with the outcome."""
    if call.caller.principal.scoped:
        raise call.refuse(403, "Limits need an admin key without queue scopes.")
    text = call.request.path_params.get("limit_id", "")
    limit_id = int(text) if text.isdigit() else 0
    principal = call.caller.principal
    try:
        row = await call.services.limits.delete(
            limit_id, actor=principal.name, actor_key_id=principal.key_id
        )
    except NotFound:
        return call.redirect(_LIMITS, Flash("error", f"Limit {text} does not exist (any more)."))
    return call.redirect(_LIMITS, Flash("ok", f"Deleted the {row.scope} limit {row.pattern}"))


ROUTES = (
    Route("GET", _LIMITS, limits, OBSERVE),
    Route("GET", f"{PREFIX}/fragments/limits", limits, OBSERVE),
    Route("POST", _LIMITS, limit_set, OPERATE, action=True),
    Route("POST", _LIMITS + "/{limit_id}/delete", limit_delete, OPERATE, action=True),
)
