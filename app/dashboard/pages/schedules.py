"""Schedules (``/dashboard/schedules``): periodic schedules in name order, with keyset paging."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any
from urllib.parse import urlencode

from fastapi import Response

from app.dashboard.base import PAGE_SIZE, PREFIX
from app.dashboard.board import OBSERVE, Call, Route
from app.domain.cron import SCHEDULE_NAME_PATTERN


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
    return call.page(
        "schedules",
        nav="schedules",
        status=400 if errors else 200,
        schedules=[asdict(r) for r in rows],
        errors=errors,
        after=after or "",
        next_query=urlencode({"after": next_cursor}) if next_cursor else "",
    )


ROUTES = (
    Route("GET", f"{PREFIX}/schedules", schedules, OBSERVE),
    Route("GET", f"{PREFIX}/fragments/schedules", schedules, OBSERVE),
)
