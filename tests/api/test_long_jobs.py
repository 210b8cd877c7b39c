"""Long-running jobs: checkpoints on every lease call, progress, and the maximum run time."""

from __future__ import annotations

from datetime import datetime

import httpx
from fastapi import FastAPI
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.api.state import app_state
from app.maintenance.reaper import Reaper, ReaperConfig
from tests.api.helpers import claim, enqueue, get_job, lease, lease_call


def _seconds(later: str, earlier: str) -> float:
    return (datetime.fromisoformat(later) - datetime.fromisoformat(earlier)).total_seconds()


async def _reap(app: FastAPI) -> None:
    service = app_state(app).running().services
    await Reaper(services=service, config=ReaperConfig()).run_once()


async def test_timeout_caps_the_lease_and_stops_a_job_that_heartbeats_forever(
    app: FastAPI, client: httpx.AsyncClient, clean_db: AsyncEngine
) -> None:
    job = await enqueue(client, timeout_seconds=5, max_attempts=2)
    assert job["timeout_seconds"] == 5
    [c] = await claim(client, lease_seconds=60)
    assert _seconds(c["lease_expires_at"], c["started_at"]) <= 5
    [hb] = await lease_call(client, "heartbeat", "w1", lease(c, lease_seconds=600))
    assert hb["ok"] and _seconds(hb["lease_expires_at"], c["started_at"]) <= 5

    # The attempt has run past its timeout (moved back in time rather than waited for).
    async with clean_db.begin() as conn:
        await conn.execute(
            text(
                "UPDATE jobs SET started_at = now() - interval '6 s', "
                "lease_expires_at = now() - interval '1 s'"
            )
        )
    [hb] = await lease_call(client, "heartbeat", "w1", lease(c, checkpoint={"at": 9}))
    assert hb["ok"] is False and hb["timed_out"] is True and hb["error"] == "lease_lost"
    await _reap(app)
    after = await get_job(client, job["id"])
    assert after["status"] in ("pending", "scheduled")
    assert after["errors"][-1]["kind"] == "timed_out" and after["last_error"] == "timed out"
    assert after["checkpoint"] is None  # the refused heartbeat saved nothing

    # The second attempt times out too: attempts are exhausted, the job is dead.
    async with clean_db.begin() as conn:
        await conn.execute(
            text("UPDATE jobs SET run_at = now(), status = 'pending' WHERE status = 'scheduled'")
        )
    [c2] = await claim(client)
    async with clean_db.begin() as conn:
        await conn.execute(
            text(
                "UPDATE jobs SET started_at = now() - interval '6 s', "
                "lease_expires_at = now() - interval '1 s'"
            )
        )
    await _reap(app)
    assert (await get_job(client, c2["id"]))["status"] == "dead"


async def test_without_timeout_heartbeats_extend_freely(client: httpx.AsyncClient) -> None:
    await enqueue(client)
    [c] = await claim(client, lease_seconds=5)
    [hb] = await lease_call(client, "heartbeat", "w1", lease(c, lease_seconds=3600))
    assert hb["ok"] and _seconds(hb["lease_expires_at"], c["started_at"]) > 3000


async def test_fail_and_release_carry_a_final_checkpoint(client: httpx.AsyncClient) -> None:
    await enqueue(client)
    [c] = await claim(client)
    await lease_call(client, "heartbeat", "w1", lease(c, checkpoint={"last_id": 100}))
    await lease_call(
        client,
        "fail",
        "w1",
        lease(c, error="boom", retry_after_seconds=0, checkpoint={"last_id": 200}),
    )
    [again] = await claim(client)
    assert again["checkpoint"] == {"last_id": 200} and again["attempt"] == 2
    await lease_call(client, "release", "w1", lease(again, checkpoint={"last_id": 300}))
    job = await get_job(client, c["id"])
    assert job["checkpoint"] == {"last_id": 300} and job["checkpoint_at"] is not None


async def test_checkpoint_and_progress_sizes_are_limited(client: httpx.AsyncClient) -> None:
    await enqueue(client)
    [c] = await claim(client)
    huge = {"blob": "x" * (300 * 1024)}
    r = await client.post(
        "/v1/heartbeat", json={"worker_id": "w1", "leases": [lease(c, checkpoint=huge)]}
    )
    # 300 KiB is over the 64 KiB body limit of the test app: refused before parsing.
    assert r.status_code == 413
    big = {"blob": "x" * (20 * 1024)}
    r = await client.post(
        "/v1/heartbeat", json={"worker_id": "w1", "leases": [lease(c, progress=big)]}
    )
    assert r.status_code == 422
    assert r.json()["errors"][0]["field"] == "body.leases[0].progress"


async def test_heartbeat_extends_by_the_claims_lease_by_default(client: httpx.AsyncClient) -> None:
    await enqueue(client, lease_seconds=600)
    [c] = await claim(client, lease_seconds=3)
    [hb] = await lease_call(client, "heartbeat", "w1", lease(c))
    assert hb["ok"] and _seconds(hb["lease_expires_at"], c["started_at"]) < 60
