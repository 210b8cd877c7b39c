"""The dashboard's limits page, schedule controls, idle workers and a pending job's blockers."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator

import httpx
import pytest
from fastapi import FastAPI

from app.api.state import app_state
from tests.api.dashboard import DashboardKeys, api, csrf_of, signed_in


@pytest.fixture
async def admin(app: FastAPI, dashboard_keys: DashboardKeys) -> AsyncIterator[httpx.AsyncClient]:
    async with signed_in(app, dashboard_keys.admin) as client:
        yield client


async def test_limits_are_listed_set_and_deleted_from_the_limits_page(
    app: FastAPI, admin: httpx.AsyncClient
) -> None:
    page = await admin.get("/dashboard/limits")
    assert page.status_code == 200 and "No limits" in page.text
    token = csrf_of(page.text)
    bad = await admin.post(
        "/dashboard/limits", data={"csrf": token, "scope": "key", "pattern": "customer:*"}
    )
    assert bad.status_code == 303
    assert "give max_running, rate or both" in (await admin.get("/dashboard/limits")).text
    made = await admin.post(
        "/dashboard/limits",
        data={
            "csrf": token,
            "scope": "key",
            "pattern": "customer:*",
            "max_running": "2",
            "rate_limit": "10",
            "rate_per_seconds": "60",
        },
    )
    assert made.status_code == 303
    html = (await admin.get("/dashboard/limits")).text
    assert "Created the key limit customer:*" in html
    row = re.search(r'<tr data-limit-id="(\d+)" data-pattern="customer:\*">(.*?)</tr>', html, re.S)
    assert row is not None
    assert 'data-col="max_running">2</td>' in row.group(2)
    assert "10 per 1 min" in row.group(2)
    gone = await admin.post(f"/dashboard/limits/{row.group(1)}/delete", data={"csrf": token})
    assert gone.status_code == 303
    assert "Deleted the key limit customer:*" in (await admin.get("/dashboard/limits")).text


async def test_a_scoped_admin_sees_no_limit_form(
    app: FastAPI, dashboard_keys: DashboardKeys
) -> None:
    async with signed_in(app, dashboard_keys.scoped_admin) as scoped:
        page = await scoped.get("/dashboard/limits")
        assert page.status_code == 200 and 'id="limit-form"' not in page.text
        refused = await scoped.post(
            "/dashboard/limits",
            data={"csrf": csrf_of(page.text), "scope": "queue", "pattern": "x", "max_running": "1"},
        )
        assert refused.status_code == 403


async def test_a_schedule_is_paused_resumed_and_deleted_and_warns_of_a_paused_queue(
    app: FastAPI, admin: httpx.AsyncClient, dashboard_keys: DashboardKeys
) -> None:
    async with api(app, dashboard_keys.admin) as client:
        schedule = {"interval_seconds": 3600, "template": {"queue": "digests", "type": "d"}}
        assert (await client.put("/v1/schedules/nightly", json=schedule)).status_code == 201
        assert (await client.put("/v1/queues/digests", json={"paused": True})).status_code in (
            200,
            201,
        )
    page = await admin.get("/dashboard/schedules")
    row = page.text.split('<tr data-schedule="nightly"', 1)[1].split("</tr>", 1)[0]
    assert "queue paused" in row
    token = csrf_of(page.text)
    paused = await admin.post("/dashboard/schedules/nightly/pause", data={"csrf": token})
    assert paused.status_code == 303
    html = (await admin.get("/dashboard/schedules")).text
    assert "Paused schedule nightly" in html and "schedule-resume" in html
    await admin.post("/dashboard/schedules/nightly/resume", data={"csrf": token})
    await admin.post("/dashboard/schedules/nightly/delete", data={"csrf": token})
    html = (await admin.get("/dashboard/schedules")).text
    assert "Deleted schedule nightly" in html and 'data-schedule="nightly"' not in html
    async with api(app, dashboard_keys.admin) as client:
        audit = (await client.get("/v1/audit")).json()["entries"]
        actions = [e["action"] for e in audit if e["actor"] == "admin"]
        assert actions[:3] == ["schedule.delete", "schedule.resume", "schedule.pause"]


async def test_idle_workers_blockers_and_the_no_worker_warning(
    app: FastAPI, admin: httpx.AsyncClient, dashboard_keys: DashboardKeys
) -> None:
    async with api(app, dashboard_keys.admin) as client:
        job = (await client.post("/v1/jobs", json={"queue": "orphans", "type": "t"})).json()
        r = await client.post("/v1/claim", json={"worker_id": "idle-7", "queues": ["quiet"]})
        assert r.json()["jobs"] == []
    await app_state(app).running().services.workers.flush()
    overview = (await admin.get("/dashboard")).text
    row = overview.split('<tr data-queue="orphans"', 1)[1].split("</tr>", 1)[0]
    assert "no worker" in row
    assert 'href="/dashboard/jobs?queue=orphans&amp;state=pending">1</a>' in row
    workers = (await admin.get("/dashboard/workers")).text
    assert re.search(r'<tr data-worker-id="idle-7" data-state="idle">', workers)
    page = (await admin.get(f"/dashboard/jobs/{job['id']}")).text
    blockers = page.split('id="job-blockers"', 1)[1].split("</ul>", 1)[0]
    assert 'data-kind="no_worker"' in blockers and "orphans" in blockers
