"""Helpers of the acceptance tests of composing work (issue 21): ordered keys, workflows, batch
callbacks, run by real ``jobq serve`` processes."""

from __future__ import annotations

import re
from typing import Any

import httpx
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

_LEADER_LINE = re.compile(r"^jobq_leader (\S+)$", re.MULTILINE)


async def forget_history(engine: AsyncEngine) -> None:
    """Empties ``job_events``: ``clean_db`` restarts job ids at 1 but keeps the history of the
    jobs earlier tests made, which would then show in the new jobs' ``GET .../events``."""
    async with engine.begin() as conn:
        await conn.execute(text("TRUNCATE job_events RESTART IDENTITY"))


async def is_leader(client: httpx.AsyncClient) -> bool:
    """Whether the instance behind ``client`` runs the leader-only loops (``/metrics``)."""
    r = await client.get("/metrics")
    assert r.status_code == 200, r.text
    found = _LEADER_LINE.search(r.text)
    assert found is not None, "no jobq_leader gauge in /metrics"
    return float(found.group(1)) == 1.0


async def job_events(client: httpx.AsyncClient, job_id: int) -> list[dict[str, Any]]:
    """A job's whole history (``GET /v1/jobs/{id}/events``, every page), oldest first."""
    events: list[dict[str, Any]] = []
    after: str | None = None
    while True:
        params: dict[str, Any] = {"limit": 500}
        if after is not None:
            params["after"] = after
        r = await client.get(f"/v1/jobs/{job_id}/events", params=params)
        assert r.status_code == 200, r.text
        page = r.json()
        events.extend(page["events"])
        after = page["next_cursor"]
        if after is None:
            return events
