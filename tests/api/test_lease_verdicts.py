"""What a lease call answers when it did not take its row: replay, lost, cancelled, timed out.

Audit bugs 3, 4 and 5: a replay waiting on the row lock behind the call it repeats was told
``lease_lost`` (the fallback read saw the statement's older snapshot); a replay of a *different*
transition answered ``ok`` and did nothing; ``timeout_seconds`` was enforced only by heartbeat.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable
from typing import Any

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.api.state import app_state
from app.maintenance.reaper import Reaper, ReaperConfig
from app.store.statements import statement
from tests.api.helpers import claim, enqueue, get_job, lease, lease_call
from tests.locks import someone_waits_on_a_lock
from tests.polling import poll_until


async def _behind(
    engine: AsyncEngine, name: str, params: dict[str, Any], call: Awaitable[Any]
) -> Any:
    """Runs ``call`` while statement ``name`` holds its row uncommitted; commits, answers the call."""
    async with engine.connect() as conn:
        transaction = await conn.begin()
        await conn.execute(statement(name).clause, params)
        waiting = asyncio.ensure_future(call)
        await poll_until(lambda: someone_waits_on_a_lock(engine), what="the call to wait")
        await transaction.commit()
    return await asyncio.wait_for(waiting, 10)


def _items(job: dict[str, Any], worker: str = "w1") -> str:
    return json.dumps([{"job_id": job["id"], "lease_id": job["lease_id"], "worker_id": worker}])


async def test_a_replay_waiting_behind_the_complete_it_repeats_succeeds(
    client: httpx.AsyncClient, clean_db: AsyncEngine
) -> None:
    await enqueue(client)
    [c] = await claim(client)
    [replay] = await _behind(
        clean_db,
        "job_complete",
        {"items": _items(c)},
        lease_call(client, "complete", "w1", lease(c, result="again")),
    )
    assert replay["ok"] and replay["status"] == "succeeded" and replay["error"] is None


async def test_a_heartbeat_waiting_behind_a_cancel_learns_of_it(
    client: httpx.AsyncClient, clean_db: AsyncEngine
) -> None:
    await enqueue(client)
    [c] = await claim(client)
    [hb] = await _behind(
        clean_db,
        "job_cancel",
        {"id": c["id"], "actor": "test", "actor_key_id": None},
        lease_call(client, "heartbeat", "w1", lease(c)),
    )
    assert not hb["ok"] and hb["error"] == "lease_lost" and hb["cancelled"] is True


async def test_a_complete_waiting_behind_a_cancel_learns_of_it(
    client: httpx.AsyncClient, clean_db: AsyncEngine
) -> None:
    await enqueue(client)
    [c] = await claim(client)
    [done] = await _behind(
        clean_db,
        "job_cancel",
        {"id": c["id"], "actor": "test", "actor_key_id": None},
        lease_call(client, "complete", "w1", lease(c)),
    )
    assert not done["ok"] and done["cancelled"] is True
    assert (await get_job(client, c["id"]))["status"] == "cancelled"


@pytest.mark.parametrize(
    ("first", "then"),
    [
        ("release", "fail"),
        ("release", "complete"),
        ("release", "heartbeat"),
        ("fail", "release"),
        ("fail", "complete"),
        ("complete", "fail"),
        ("complete", "release"),
    ],
)
async def test_after_the_lease_ended_only_the_same_transition_is_a_replay(
    client: httpx.AsyncClient, first: str, then: str
) -> None:
    await enqueue(client, max_attempts=5)
    [c] = await claim(client)
    extra = {"retry_after_seconds": 0} if first == "fail" else {}
    [ended] = await lease_call(client, first, "w1", lease(c, **extra))
    assert ended["ok"]
    before = await get_job(client, c["id"])

    fields = {"error": "late", "retryable": False} if then == "fail" else {}
    [other] = await lease_call(client, then, "w1", lease(c, **fields))
    assert not other["ok"] and other["error"] == "lease_lost", other
    after = await get_job(client, c["id"])
    assert (after["status"], after["errors"], after["attempts"]) == (
        before["status"],
        before["errors"],
        before["attempts"],
    )

    [again] = await lease_call(client, first, "w1", lease(c, **extra))
    assert again["ok"] and again["status"] == before["status"]


async def test_a_late_call_after_the_reaper_took_the_lease_is_lost(
    client: httpx.AsyncClient, clean_db: AsyncEngine
) -> None:
    await enqueue(client)
    [c] = await claim(client)
    async with clean_db.begin() as conn:
        await conn.execute(text("UPDATE jobs SET lease_expires_at = now() - interval '1 s'"))
    app = client._transport.app  # type: ignore[attr-defined]
    await Reaper(services=app_state(app).running().services, config=ReaperConfig()).run_once()
    for op in ("complete", "fail", "release", "heartbeat"):
        [late] = await lease_call(client, op, "w1", lease(c))
        assert not late["ok"] and not late["cancelled"] and not late["timed_out"], (op, late)


@pytest.mark.parametrize("op", ["complete", "fail", "release", "heartbeat"])
async def test_every_lease_call_past_the_timeout_answers_timed_out(
    client: httpx.AsyncClient, clean_db: AsyncEngine, op: str
) -> None:
    # Audit bug 5: only heartbeat used to check timeout_seconds; a complete or fail past it took.
    await enqueue(client, timeout_seconds=60)
    [c] = await claim(client, lease_seconds=600)
    async with clean_db.begin() as conn:
        await conn.execute(text("UPDATE jobs SET started_at = now() - interval '61 seconds'"))
    [late] = await lease_call(client, op, "w1", lease(c))
    assert not late["ok"] and late["timed_out"] is True and late["error"] == "lease_lost", late
    job = await get_job(client, c["id"])
    assert job["status"] == "running" and job["result"] is None and job["errors"] == []


async def test_timed_out_is_still_told_after_the_reaper_ended_the_attempt(
    client: httpx.AsyncClient, clean_db: AsyncEngine
) -> None:
    await enqueue(client, timeout_seconds=60)
    [c] = await claim(client)
    async with clean_db.begin() as conn:
        await conn.execute(
            text(
                "UPDATE jobs SET started_at = now() - interval '61 seconds', "
                "lease_expires_at = now() - interval '1 second'"
            )
        )
    app = client._transport.app  # type: ignore[attr-defined]
    await Reaper(services=app_state(app).running().services, config=ReaperConfig()).run_once()
    [late] = await lease_call(client, "complete", "w1", lease(c))
    assert not late["ok"] and late["timed_out"] is True
