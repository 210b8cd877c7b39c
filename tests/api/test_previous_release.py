"""Expand / contract: the previous release's statements still work on the newest schema.

During a rolling deploy the database is migrated first, and instances of the previous release
keep serving until they are replaced. ``previous_release/jobs.sql`` is the named SQL of the
release before migration 0010 (``git show 938010d:app/queue/sql/jobs.sql``; today's statements
live in app/store/sql/); here every
statement of it runs, through the API, against a database migrated to head. When a migration
changes what the statements touch, refresh the copy to the release before it.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.api.state import app_state
from app.store import conn as store_conn
from app.store.statements import NamedStatement, load_statements, parse_statements
from tests.api.helpers import claim, enqueue, get_job, lease, lease_call

PREVIOUS_SQL = Path(__file__).parent / "previous_release" / "jobs.sql"


@pytest.fixture
def previous_statements(monkeypatch: pytest.MonkeyPatch) -> set[str]:
    """Every statement the previous release has runs as it had it; answers the names used."""
    previous = parse_statements(PREVIOUS_SQL.read_text(encoding="utf-8"))
    current = load_statements()
    used: set[str] = set()

    def lookup(name: str) -> NamedStatement:
        if name in previous:
            used.add(name)
            return previous[name]
        return current[name]  # new in this release: the previous one never runs it

    monkeypatch.setattr(store_conn, "statement", lookup)
    return used


async def test_the_previous_release_serves_the_whole_lifecycle_on_the_new_schema(
    app: FastAPI,
    client: httpx.AsyncClient,
    clean_db: AsyncEngine,
    previous_statements: set[str],
) -> None:
    # Enqueue (single and keyed), claim, heartbeat with a checkpoint, complete.
    job = await enqueue(client, queue="q", payload={"n": 1})
    keyed = await enqueue(client, queue="q", idempotency_key="k1")
    again = await client.post("/v1/jobs", json={"queue": "q", "type": "t", "idempotency_key": "k1"})
    assert again.status_code == 200 and again.json()["id"] == keyed["id"]
    held = await claim(client, queues=["q"], max_jobs=2)
    assert {j["id"] for j in held} == {job["id"], keyed["id"]}
    [beat] = await lease_call(client, "heartbeat", "w1", lease(held[0], checkpoint={"at": 3}))
    assert beat["ok"] is True
    [done] = await lease_call(client, "complete", "w1", lease(held[0], result={"ok": 1}))
    assert done["status"] == "succeeded"
    # A replayed complete answers as a replay (the verdict statement).
    [replay] = await lease_call(client, "complete", "w1", lease(held[0], result={"ok": 1}))
    assert replay["ok"] is True and replay["status"] == "succeeded"
    # Release, then fail to dead.
    [released] = await lease_call(client, "release", "w1", lease(held[1]))
    assert released["status"] == "pending"
    [again_held] = await claim(client, queues=["q"])
    [dead] = await lease_call(
        client, "fail", "w1", lease(again_held, error="boom", retryable=False)
    )
    assert dead["status"] == "dead"
    # Ops: retry, cancel, pause / resume, queue counts, workers, the audit trail.
    r = await client.post(f"/v1/jobs/{keyed['id']}/retry")
    assert r.status_code == 200 and r.json()["status"] == "pending"
    r = await client.post(f"/v1/jobs/{keyed['id']}/cancel")
    assert r.status_code == 200 and r.json()["status"] == "cancelled"
    assert (await client.post("/v1/queues/q/pause")).json()["paused"] is True
    assert (await client.post("/v1/queues/q/resume")).json()["paused"] is False
    later = await enqueue(client, queue="q", delay_seconds=3600)
    [running] = (await enqueue(client, queue="r"), await claim(client, queues=["r"]))[1]
    stats = {s["name"]: s for s in (await client.get("/v1/queues")).json()["queues"]}
    assert (stats["q"]["succeeded"], stats["q"]["cancelled"], stats["q"]["scheduled"]) == (1, 1, 1)
    [worker] = (await client.get("/v1/workers")).json()["workers"]
    assert worker["job_ids"] == [running["id"]]
    assert worker["instance"] is None  # the previous release does not record it
    actions = {e["action"] for e in (await client.get("/v1/audit")).json()["entries"]}
    assert {"job.retry", "job.cancel", "queue.pause", "queue.resume"} <= actions

    # Maintenance: reap the lease past its expiry, promote the delayed job, prune the history.
    runtime = app_state(app).runtime
    assert runtime is not None
    service = runtime.services
    async with clean_db.connect() as conn:
        now = await conn.scalar(text("SELECT now()"))
    # The job page's lease holder lookup still runs the previous release's worker_list.
    assert [w.job_ids for w in await service.ops.workers()] == [[running["id"]]]
    reaped = await service.upkeep.reap(batch_size=10, now=now + timedelta(seconds=60))
    assert [r.id for r in reaped] == [running["id"]]
    promoted = await service.upkeep.promote(batch_size=10, now=now + timedelta(hours=2))
    # The delayed job, and the reaped one's retry once its backoff passed.
    assert promoted == 2 and (await get_job(client, later["id"]))["status"] == "pending"
    pruned = await service.upkeep.prune(
        batch_size=10,
        succeeded_seconds=0,
        cancelled_seconds=0,
        dead_seconds=0,
        now=now + timedelta(days=1),
    )
    assert pruned == 2  # the succeeded job, and the dead one retried then cancelled
    # Every outcome counted so far lies more than a day before that "now".
    assert (
        await service.upkeep.prune_throughput(
            keep_seconds=0, batch_size=100, now=now + timedelta(days=1)
        )
        >= 3
    )

    previous: Any = parse_statements(PREVIOUS_SQL.read_text(encoding="utf-8"))
    unused = set(previous) - previous_statements - {"maintenance_try_lead", "health_ping"}
    assert not unused, f"statements of the previous release this test never ran: {unused}"
