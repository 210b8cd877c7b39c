"""Trigger now (issue 20, item 5): one job from a schedule's template, outside its timing.

The schedule does not move (next run, last run and its job stay), a paused schedule or queue
does not stop it, the job and its audit row commit together, and only admin keys within the
schedule's queue may do it, from the API or the dashboard.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import datetime
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.api.audit_models import AuditAction
from app.api.state import app_state
from app.models import AUDIT_ACTIONS
from app.settings import Settings
from tests.api.dashboard import DashboardKeys, api, csrf_of, signed_in
from tests.keys import Keys, as_key


@pytest.fixture(autouse=True)
async def no_schedules_left(clean_db: AsyncEngine) -> AsyncIterator[None]:
    """No schedule outlives the test (a later test's server would run it)."""
    yield
    async with clean_db.begin() as conn:
        await conn.execute(text("TRUNCATE schedules"))


DIGEST: dict[str, Any] = {
    "interval_seconds": 3600,
    "template": {
        "queue": "billing.digests",
        "type": "digest",
        "payload": {"format": "html", "ids": [1, 2]},
        "priority": 5,
        "timeout_seconds": 600,
        "concurrency_key": "tenant:7",
    },
}


async def jobs_of(engine: AsyncEngine) -> list[dict[str, Any]]:
    async with engine.connect() as conn:
        result = await conn.execute(
            text("SELECT id, queue, schedule_name, scheduled_for FROM jobs ORDER BY id")
        )
        return [dict(r) for r in result.mappings()]


async def trigger_audit(engine: AsyncEngine) -> list[dict[str, Any]]:
    async with engine.connect() as conn:
        result = await conn.execute(
            text(
                "SELECT actor, actor_key_id, outcome, queue, job_id, state_before, state_after, "
                "detail FROM audit_log WHERE action = 'schedule.trigger' ORDER BY id"
            )
        )
        return [dict(r) for r in result.mappings()]


async def test_a_trigger_enqueues_one_job_from_the_template_and_the_schedule_stays(
    client: httpx.AsyncClient, keys: Keys, clean_db: AsyncEngine
) -> None:
    admin = as_key(client, keys.admin)
    made = await admin.put("/v1/schedules/digest", json=DIGEST)
    assert made.status_code == 201, made.text
    before = made.json()

    answer = await admin.post("/v1/schedules/digest/trigger")
    assert answer.status_code == 201, answer.text
    job = answer.json()
    template = DIGEST["template"]
    assert (job["queue"], job["type"], job["payload"]) == (
        template["queue"],
        template["type"],
        template["payload"],
    )
    assert (job["priority"], job["timeout_seconds"], job["concurrency_key"]) == (5, 600, "tenant:7")
    assert job["status"] == "pending" and job["attempts"] == 0
    defaults = Settings(database_url="postgresql://unused/unused")
    assert job["max_attempts"] == defaults.max_attempts_default
    assert job["lease_seconds"] == defaults.lease_seconds_default
    assert job["idempotency_key"] is None
    # The same wire model as GET /v1/jobs/{id}.
    read = await admin.get(f"/v1/jobs/{job['id']}")
    assert read.status_code == 200 and read.json() == job

    # Exactly one job, named after the schedule but not a run (no instant).
    assert await jobs_of(clean_db) == [
        {
            "id": job["id"],
            "queue": "billing.digests",
            "schedule_name": "digest",
            "scheduled_for": None,
        }
    ]
    # The schedule did not move: next run, last run and last job as they were.
    after = (await admin.get("/v1/schedules/digest")).json()
    assert after == before
    assert after["last_run_at"] is None and after["last_job_id"] is None

    [entry] = await trigger_audit(clean_db)
    assert entry["actor"] == "admin" and entry["actor_key_id"] is not None
    assert (entry["outcome"], entry["queue"], entry["job_id"]) == (
        "changed",
        "billing.digests",
        job["id"],
    )
    assert (entry["state_before"], entry["state_after"]) == (None, "pending")
    assert entry["detail"]["schedule"] == "digest" and entry["detail"]["job_id"] == job["id"]
    assert entry["detail"]["schedule_paused"] is False
    trail = await admin.get("/v1/audit", params={"action": "schedule.trigger"})
    assert trail.status_code == 200
    assert [(e["actor"], e["job_id"]) for e in trail.json()["entries"]] == [("admin", job["id"])]

    # Its history says which schedule enqueued it.
    events = (await admin.get(f"/v1/jobs/{job['id']}/events")).json()["events"]
    assert events[0]["kind"] == "enqueued"
    assert events[0]["data"] == {"queue": "billing.digests", "schedule": "digest"}


async def test_triggers_are_jobs_more_and_the_runs_keep_their_rhythm(
    app: FastAPI, client: httpx.AsyncClient, clean_db: AsyncEngine
) -> None:
    """Triggered jobs carry no run instant: the unique run index never meets them, and the
    scheduler's last run is the run's job, not a trigger's."""
    made = await client.put("/v1/schedules/digest", json=DIGEST)
    due = datetime.fromisoformat(made.json()["next_run_at"])
    first = (await client.post("/v1/schedules/digest/trigger")).json()
    second = (await client.post("/v1/schedules/digest/trigger")).json()
    assert first["id"] != second["id"]

    service = app_state(app).running().services
    outcome = await service.schedules.enqueue_runs(batch_size=10, now=due)
    assert (outcome.schedules, outcome.enqueued) == (1, 1)
    shown = (await client.get("/v1/schedules/digest")).json()
    assert datetime.fromisoformat(shown["last_run_at"]) == due
    assert shown["last_job_id"] not in {first["id"], second["id"]}
    third = await client.post("/v1/schedules/digest/trigger")
    assert third.status_code == 201
    assert (await client.get("/v1/schedules/digest")).json() == shown

    rows = await jobs_of(clean_db)
    assert [r["scheduled_for"] is None for r in rows] == [True, True, False, True]
    assert {r["schedule_name"] for r in rows} == {"digest"}
    assert len(await trigger_audit(clean_db)) == 3


async def test_a_paused_schedule_on_a_paused_queue_is_still_triggered(
    client: httpx.AsyncClient, clean_db: AsyncEngine
) -> None:
    assert (await client.put("/v1/schedules/digest", json=DIGEST)).status_code == 201
    assert (await client.post("/v1/schedules/digest/pause")).json()["paused"] is True
    paused_queue = await client.put("/v1/queues/billing.digests", json={"paused": True})
    assert paused_queue.status_code in (200, 201), paused_queue.text
    before = (await client.get("/v1/schedules/digest")).json()

    answer = await client.post("/v1/schedules/digest/trigger")
    assert answer.status_code == 201, answer.text
    assert answer.json()["status"] == "pending"
    assert (await client.get("/v1/schedules/digest")).json() == before
    # Waiting in its paused queue: no claim takes it.
    claim = await client.post("/v1/claim", json={"worker_id": "w", "queues": ["billing.digests"]})
    assert claim.json()["jobs"] == []
    [entry] = await trigger_audit(clean_db)
    assert entry["actor"] == "anonymous" and entry["detail"]["schedule_paused"] is True


async def test_an_unknown_schedule_is_a_404_problem_and_writes_nothing(
    client: httpx.AsyncClient, clean_db: AsyncEngine
) -> None:
    answer = await client.post("/v1/schedules/nope/trigger")
    assert answer.status_code == 404
    assert answer.headers["content-type"] == "application/problem+json"
    assert "nope" in answer.json()["detail"]
    assert (await client.post("/v1/schedules/%3Cx%3E/trigger")).status_code == 422
    assert await jobs_of(clean_db) == [] and await trigger_audit(clean_db) == []


async def test_only_admin_keys_within_the_schedules_queue_may_trigger(
    client: httpx.AsyncClient, keys: Keys, clean_db: AsyncEngine
) -> None:
    admin = as_key(client, keys.admin)
    emails = {**DIGEST, "template": {"queue": "emails", "type": "digest"}}
    assert (await admin.put("/v1/schedules/emails-digest", json=emails)).status_code == 201
    assert (await admin.put("/v1/schedules/digest", json=DIGEST)).status_code == 201

    for secret in (keys.viewer, keys.producer, keys.worker, keys.scoped_viewer):
        refused = await as_key(client, secret).post("/v1/schedules/digest/trigger")
        assert refused.status_code == 403
        assert refused.headers["content-type"] == "application/problem+json"
    unsigned = await as_key(client, None).post("/v1/schedules/digest/trigger")
    assert unsigned.status_code == 401
    # A billing.* admin: not another queue's schedule (named as the other scope checks do) ...
    scoped = as_key(client, keys.scoped_admin)
    out = await scoped.post("/v1/schedules/emails-digest/trigger")
    assert out.status_code == 403
    assert out.headers["content-type"] == "application/problem+json"
    assert out.json()["errors"] == [
        {"field": "path.name", "message": "queue outside the key's scopes"}
    ]
    assert await jobs_of(clean_db) == [] and await trigger_audit(clean_db) == []
    # ... but its own queue's.
    mine = await scoped.post("/v1/schedules/digest/trigger")
    assert mine.status_code == 201 and mine.json()["queue"] == "billing.digests"
    [entry] = await trigger_audit(clean_db)
    assert entry["actor"] == "billing-admin"


def test_the_audit_trail_knows_the_actions_the_table_allows() -> None:
    assert {a.value for a in AuditAction} == set(AUDIT_ACTIONS)
    assert AuditAction.SCHEDULE_TRIGGER == "schedule.trigger"


async def test_the_dashboard_triggers_a_schedule_and_links_its_job(
    app: FastAPI, dashboard_keys: DashboardKeys, clean_db: AsyncEngine
) -> None:
    async with api(app, dashboard_keys.admin) as client:
        assert (await client.put("/v1/schedules/digest", json=DIGEST)).status_code == 201
        emails = {**DIGEST, "template": {"queue": "emails", "type": "d"}}
        assert (await client.put("/v1/schedules/emails-digest", json=emails)).status_code == 201
        before = (await client.get("/v1/schedules/digest")).json()

    async with signed_in(app, dashboard_keys.viewer) as viewer:
        page = await viewer.get("/dashboard/schedules")
        assert "schedule-trigger" not in page.text
        refused = await viewer.post(
            "/dashboard/schedules/digest/trigger", data={"csrf": csrf_of(page.text)}
        )
        assert refused.status_code == 403

    async with signed_in(app, dashboard_keys.admin) as admin:
        page = await admin.get("/dashboard/schedules")
        row = page.text.split('<tr data-schedule="digest"', 1)[1].split("</tr>", 1)[0]
        assert 'action="/dashboard/schedules/digest/trigger"' in row
        assert 'class="secondary schedule-trigger"' in row
        # Without the CSRF token nothing happens.
        forged = await admin.post("/dashboard/schedules/digest/trigger")
        assert forged.status_code == 403 and await jobs_of(clean_db) == []
        done = await admin.post(
            "/dashboard/schedules/digest/trigger", data={"csrf": csrf_of(page.text)}
        )
        assert done.status_code == 303
        assert done.headers["location"] == "/dashboard/schedules"
        [job] = await jobs_of(clean_db)
        html = (await admin.get("/dashboard/schedules")).text
        flash = html.split('<div id="flash"', 1)[1].split("</div>", 1)[0]
        assert "Triggered schedule digest: " in flash
        assert f'href="/dashboard/jobs/{job["id"]}">job {job["id"]}</a>' in flash
        # Shown once.
        assert 'id="flash"' not in (await admin.get("/dashboard/schedules")).text
        history = (await admin.get(f"/dashboard/jobs/{job['id']}")).text
        assert "by a trigger of schedule digest" in history

    async with signed_in(app, dashboard_keys.scoped_admin) as scoped:
        page = await scoped.get("/dashboard/schedules")
        assert 'data-schedule="emails-digest"' not in page.text
        out = await scoped.post(
            "/dashboard/schedules/emails-digest/trigger", data={"csrf": csrf_of(page.text)}
        )
        assert out.status_code == 303
        html = (await scoped.get("/dashboard/schedules")).text
        assert "outside this key&#39;s scopes" in html and 'id="flash-job"' not in html

    assert len(await jobs_of(clean_db)) == 1
    async with api(app, dashboard_keys.admin) as client:
        assert (await client.get("/v1/schedules/digest")).json() == before
        audit = (await client.get("/v1/audit", params={"action": "schedule.trigger"})).json()
        assert [(e["actor"], e["job_id"]) for e in audit["entries"]] == [("admin", job["id"])]
