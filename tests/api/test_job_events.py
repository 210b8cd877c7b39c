"""The service tells its observers of every committed state change, once, and of nothing else."""

from __future__ import annotations

from collections.abc import Sequence

import httpx
from fastapi import FastAPI
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.api.state import app_state
from app.domain.types import JobEvent
from tests.api.helpers import claim, enqueue, lease, lease_call


async def test_each_transition_is_one_event_and_replays_are_none(
    app: FastAPI, client: httpx.AsyncClient, clean_db: AsyncEngine
) -> None:
    service = app_state(app).running().services
    seen: list[JobEvent] = []

    def observe(events: Sequence[JobEvent]) -> None:
        seen.extend(events)

    service.events.subscribe(observe)
    a = await enqueue(client, queue="q")
    b = await enqueue(client, queue="q", max_attempts=1)
    c = await enqueue(client, queue="q")
    replay = await client.post("/v1/jobs", json={"queue": "q", "type": "t", "idempotency_key": "k"})
    again = await client.post("/v1/jobs", json={"queue": "q", "type": "t", "idempotency_key": "k"})
    assert (replay.status_code, again.status_code) == (201, 200)
    held = {j["id"]: j for j in await claim(client, "w1", ["q"], max_jobs=4)}
    assert len(held) == 4
    await lease_call(client, "complete", "w1", lease(held[a["id"]]))
    await lease_call(client, "complete", "w1", lease(held[a["id"]]))  # a replay: no event
    await lease_call(client, "fail", "w1", lease(held[b["id"]], error="boom"))
    await lease_call(client, "release", "w1", lease(held[c["id"]]))
    await lease_call(client, "heartbeat", "w1", lease(held[replay.json()["id"]]))
    async with clean_db.begin() as conn:
        await conn.execute(text("UPDATE jobs SET lease_expires_at = now() - interval '1 s'"))
    reaped = await service.upkeep.reap(batch_size=10)
    assert len(reaped) == 1
    assert (await client.post(f"/v1/jobs/{c['id']}/cancel")).status_code == 200
    assert (await client.post(f"/v1/jobs/{c['id']}/retry")).status_code == 200

    kinds = [(e.kind, e.job_id) for e in seen]
    k = replay.json()["id"]
    assert kinds == [
        ("enqueued", a["id"]),
        ("enqueued", b["id"]),
        ("enqueued", c["id"]),
        ("enqueued", k),
        *[("claimed", job_id) for job_id in sorted(held, key=list(held).index)],
        ("completed", a["id"]),
        ("dead", b["id"]),
        ("released", c["id"]),
        ("reaped", k),
        ("cancelled", c["id"]),
        ("retried", c["id"]),
    ]
    claimed = [e for e in seen if e.kind == "claimed"]
    assert {(e.worker_id, e.attempt, e.queue) for e in claimed} == {("w1", 1, "q")}
    assert [e.status for e in seen if e.kind in {"completed", "dead", "released"}] == [
        "succeeded",
        "dead",
        "pending",
    ]
