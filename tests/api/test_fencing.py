"""Fencing: once the reaper hands a silent worker's job to another, the first worker's calls all fail."""

from __future__ import annotations

import httpx
from fastapi import FastAPI
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.api.state import app_state
from app.maintenance.reaper import Reaper, ReaperConfig
from tests.api.helpers import claim, enqueue, get_job, lease, lease_call


async def test_silent_worker_is_fenced_after_reap_and_reclaim(
    app: FastAPI, client: httpx.AsyncClient, clean_db: AsyncEngine
) -> None:
    job = await enqueue(client)
    [a] = await claim(client, worker="A", lease_seconds=1)
    # A goes silent; its lease runs out (moved into the past rather than waited for).
    async with clean_db.begin() as conn:
        await conn.execute(text("UPDATE jobs SET lease_expires_at = now() - interval '1 s'"))
    service = app_state(app).running().services
    reaper = Reaper(services=service, config=ReaperConfig())
    counts = await reaper.run_once()
    assert counts.retried == 1
    async with clean_db.begin() as conn:  # skip the backoff delay
        await conn.execute(
            text("UPDATE jobs SET run_at = now(), status = 'pending' WHERE status = 'scheduled'")
        )
    [b] = await claim(client, worker="B")
    assert b["id"] == job["id"] and b["attempt"] == 2 and b["lease_id"] != a["lease_id"]

    for op in ("heartbeat", "complete", "fail", "release"):
        extra = {} if op == "complete" else {"checkpoint": {"from": "A"}}
        [res] = await lease_call(client, op, "A", lease(a, **extra))
        assert res["ok"] is False and res["error"] == "lease_lost", (op, res)

    [done] = await lease_call(client, "complete", "B", lease(b, result="by B"))
    assert done["ok"] is True
    final = await get_job(client, job["id"])
    assert final["status"] == "succeeded" and final["worker_id"] == "B"
    assert final["result"] == "by B" and final["checkpoint"] is None and final["attempts"] == 2
