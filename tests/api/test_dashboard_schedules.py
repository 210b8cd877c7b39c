"""The schedules page: every schedule with its timing, zone, queue, next and last run (and job)."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator

import pytest
from fastapi import FastAPI
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.api.state import app_state
from tests.api.dashboard import HOSTILE, DashboardKeys, api, signed_in


@pytest.fixture(autouse=True)
async def no_schedules_left(clean_db: AsyncEngine) -> AsyncIterator[None]:
    """No schedule outlives the test (a later test's server would run it)."""
    yield
    async with clean_db.begin() as conn:
        await conn.execute(text("TRUNCATE schedules"))


def row_of(html: str, name: str) -> str:
    return html.split(f'<tr data-schedule="{name}"', 1)[1].split("</tr>", 1)[0]


def cell(row: str, column: str) -> str:
    found = re.search(rf'<td data-col="{column}"[^>]*>(.*?)</td>', row, re.S)
    assert found is not None, row
    return found.group(1)


async def test_the_schedules_page_lists_timing_runs_and_the_last_job(
    app: FastAPI, dashboard_keys: DashboardKeys, clean_db: AsyncEngine
) -> None:
    async with api(app, dashboard_keys.admin) as client:
        for name, body in {
            "nightly": {
                "cron": "30 2 * * *",
                "timezone": "Europe/Berlin",
                "template": {"queue": "billing.reports", "type": f"n{HOSTILE}"},
            },
            "poll": {"interval_seconds": 90, "template": {"queue": "emails", "type": "poll"}},
        }.items():
            answer = await client.put(f"/v1/schedules/{name}", json=body)
            assert answer.status_code == 201, answer.text
        assert (await client.post("/v1/schedules/poll/pause")).status_code == 200
    # Missed since New Year: a scheduler pass enqueues the latest run (catch_up 0).
    async with clean_db.begin() as conn:
        await conn.execute(
            text(
                "UPDATE schedules SET next_run_at = '2026-01-01 01:30:00+00' WHERE name = 'nightly'"
            )
        )
    service = app_state(app).running().services
    assert (await service.schedules.enqueue_runs(batch_size=10)).enqueued == 1
    job_id = (await service.schedules.get("nightly")).last_job_id

    async with signed_in(app, dashboard_keys.viewer) as viewer:
        page = await viewer.get("/dashboard/schedules")
        assert page.status_code == 200
        html = page.text
        assert 'id="nav-schedules"' in html and 'aria-current="page">Schedules' in html
        nightly = row_of(html, "nightly")
        assert "<code>30 2 * * *</code>" in cell(nightly, "when")
        assert cell(nightly, "zone") == "Europe/Berlin"
        assert "billing.reports" in cell(nightly, "queue")
        assert HOSTILE not in html and "&lt;script&gt;" in cell(nightly, "type")
        assert f'href="/dashboard/jobs/{job_id}"' in cell(nightly, "last")
        assert "<time" in cell(nightly, "next") and "paused" not in nightly
        poll = row_of(html, "poll")
        assert cell(poll, "when") == "every 1 min 30 s"
        assert "paused-badge" in poll and "paused" in cell(poll, "next")
        assert "—" in cell(poll, "last")

        fragment = await viewer.get(
            "/dashboard/fragments/schedules", headers={"HX-Request": "true"}
        )
        assert fragment.status_code == 200
        assert fragment.text.lstrip().startswith('<section id="schedules-live"')
        assert "<html" not in fragment.text
        assert (await viewer.get("/dashboard/schedules?after=%3Cx%3E")).status_code == 400

    async with signed_in(app, dashboard_keys.scoped_viewer) as scoped:
        html = (await scoped.get("/dashboard/schedules")).text
        assert 'data-schedule="nightly"' in html and 'data-schedule="poll"' not in html


async def test_the_page_needs_a_session_and_shows_an_empty_list(
    app: FastAPI, dashboard_keys: DashboardKeys
) -> None:
    async with api(app) as anonymous:
        answer = await anonymous.get("/dashboard/schedules")
        assert answer.status_code == 303
        assert answer.headers["location"].startswith("/dashboard/login")
    async with signed_in(app, dashboard_keys.admin) as admin:
        page = await admin.get("/dashboard/schedules")
        assert page.status_code == 200 and "No schedule yet" in page.text


async def test_a_schedule_in_error_shows_its_error(
    app: FastAPI, dashboard_keys: DashboardKeys, clean_db: AsyncEngine
) -> None:
    """Regression (issue 18, defect 9): a schedule no pass could plan looked like any other."""
    async with api(app, dashboard_keys.admin) as client:
        body = {"cron": "0 3 * * *", "template": {"queue": "billing.reports", "type": "n"}}
        assert (await client.put("/v1/schedules/lost", json=body)).status_code == 201
        assert (await client.put("/v1/schedules/fine", json=body)).status_code == 201
    async with clean_db.begin() as conn:
        await conn.execute(
            text(
                "UPDATE schedules SET timezone = 'Mars/Olympus', "
                "next_run_at = now() - interval '1 minute' WHERE name = 'lost'"
            )
        )
    service = app_state(app).running().services
    assert [name for name, _ in (await service.schedules.enqueue_runs(batch_size=10)).failed] == [
        "lost"
    ]

    async with signed_in(app, dashboard_keys.viewer) as viewer:
        html = (await viewer.get("/dashboard/schedules")).text
        lost = row_of(html, "lost")
        assert "error-badge" in lost and "Mars/Olympus" in cell(lost, "next")
        fine = row_of(html, "fine")
        assert "error-badge" not in fine and "<time" in cell(fine, "next")
