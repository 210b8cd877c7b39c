"""A page per queue, and jobs picked one by one for retry or cancel (issue 20, item 6)."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.api.dashboard import DashboardKeys, Seeded, api, csrf_of, job_status, signed_in
from tests.api.test_queue_stats import finished

STATES = ("scheduled", "pending", "running", "succeeded", "dead", "cancelled")
_HIDDEN = re.compile(r'<input type="hidden" name="([^"]+)" value="([^"]*)">')


def hidden_fields(html: str) -> dict[str, str]:
    return dict(_HIDDEN.findall(html))


def count_of(html: str, state: str) -> str:
    item = html.split(f'<div data-col="{state}">', 1)[1].split("</div>", 1)[0]
    return re.sub(r"<[^>]+>", "", item.split("<dd>", 1)[1]).strip()


def figure(html: str, window: int, column: str) -> str:
    found = re.search(
        rf'<td class="num" data-window="{window}" data-col="{column}">(.*?)</td>', html
    )
    assert found is not None, (window, column)
    return re.sub(r"<[^>]+>", "", found.group(1))


def timing(html: str, kind: str, window: int, column: str) -> str:
    row = html.split(f'<tr data-figure="{kind}" data-window="{window}">', 1)[1].split("</tr>")[0]
    found = re.search(rf'data-col="{column}"[^>]*>(.*?)</(?:td|span)>', row)
    assert found is not None, (kind, window, column)
    return found.group(1)


@pytest.fixture
async def admin(app: FastAPI, dashboard_keys: DashboardKeys) -> AsyncIterator[httpx.AsyncClient]:
    async with signed_in(app, dashboard_keys.admin) as client:
        yield client


@pytest.fixture
async def viewer(app: FastAPI, dashboard_keys: DashboardKeys) -> AsyncIterator[httpx.AsyncClient]:
    async with signed_in(app, dashboard_keys.viewer) as client:
        yield client


async def test_the_overview_links_each_queue_to_its_page(
    admin: httpx.AsyncClient, seeded: Seeded
) -> None:
    html = (await admin.get("/dashboard")).text
    row = html.split('<tr data-queue="emails"', 1)[1].split("</tr>", 1)[0]
    assert '<a class="queue-link" href="/dashboard/queues/emails"' in row
    # The counts still link to the jobs of that state.
    assert 'href="/dashboard/jobs?queue=emails&amp;state=pending">2</a>' in row
    jobs = (await admin.get("/dashboard/jobs?queue=emails")).text
    assert '<a class="queue-link" href="/dashboard/queues/emails">emails</a>' in jobs


async def test_a_queue_page_shows_counts_chart_rates_and_percentiles(
    admin: httpx.AsyncClient, seeded: Seeded, clean_db: AsyncEngine
) -> None:
    for waited, ran in ((0.5, 1), (1.5, 2), (2.5, 3)):
        await finished(clean_db, queue="emails", waited=waited, ran=ran)
    await finished(clean_db, queue="emails", status="dead", ended_by="fail", attempts=3, ran=4)
    page = await admin.get("/dashboard/queues/emails")
    assert page.status_code == 200, page.text
    html = page.text
    assert '<span id="queue-name">emails</span>' in html
    # Seeded: two pending and one cancelled; then three succeeded and one dead here.
    assert [count_of(html, s) for s in STATES] == ["0", "2", "0", "3", "1", "1"]
    assert 'href="/dashboard/jobs?queue=emails&amp;state=dead">1</a>' in html
    assert '<span class="active-badge">active</span>' in html
    assert "No queue limit." in html
    # The overview's chart, this queue's jobs only: the seeded outcomes were in other queues.
    assert '<svg id="throughput"' in html and "of queue emails" in html
    assert "0 succeeded, 0 failed attempts, 0 dead in the last 60 minutes" in html
    fast = (await admin.get("/dashboard/queues/fast")).text
    assert "1 succeeded, 0 failed attempts, 0 dead in the last 60 minutes" in fast
    flaky = (await admin.get("/dashboard/queues/flaky")).text
    assert "0 succeeded, 1 failed attempts, 1 dead in the last 60 minutes" in flaky
    assert flaky.count('class="failed"') == 1 and flaky.count('class="dead"') == 1
    # Rates, each with what it divides: one cancelled (seeded) among five finished.
    assert figure(html, 3600, "finished") == "5 (3 · 1 · 1)"
    assert figure(html, 3600, "dead_rate") == "20.0 % (1 of 5)"
    assert figure(html, 3600, "failed_attempt_rate") == "50.0 % (3 of 6)"
    assert timing(html, "wait", 3600, "jobs") == "4"
    assert timing(html, "run", 3600, "p50") == "2.5 s"
    assert timing(html, "run", 86_400, "p99") == "3.97 s"
    assert timing(html, "wait", 3600, "p50") == "1.25 s"  # of 0.5, 1 (the dead one), 1.5, 2.5
    assert "data-truncated" not in html
    # Admins get the switch, which comes back to this page.
    assert 'action="/dashboard/queues/emails/pause"' in html
    fragment = await admin.get("/dashboard/fragments/queues/emails", headers={"HX-Request": "true"})
    assert fragment.text.lstrip().startswith('<section id="queue-live"')
    assert "<html" not in fragment.text


async def test_pause_from_the_queue_page_comes_back_to_it_and_shows_the_limit(
    app: FastAPI, admin: httpx.AsyncClient, seeded: Seeded, dashboard_keys: DashboardKeys
) -> None:
    async with api(app, dashboard_keys.admin) as client:
        r = await client.put(
            "/v1/limits", json={"scope": "queue", "pattern": "em*", "max_running": 4}
        )
        assert r.status_code == 201, r.text
        r = await client.put(
            "/v1/limits",
            json={"scope": "queue", "pattern": "emails", "rate": {"limit": 10, "per_seconds": 60}},
        )
        assert r.status_code == 201, r.text
    page = await admin.get("/dashboard/queues/emails")
    # Of two matching patterns the longest applies, as the claim picks it.
    assert "Queue limit (emails): 10 claims per 1 min." in page.text
    form = hidden_fields(page.text.split('action="/dashboard/queues/emails/pause"', 1)[1])
    assert form["back"] == "queue"
    paused = await admin.post("/dashboard/queues/emails/pause", data=form)
    assert paused.status_code == 303
    assert paused.headers["location"] == "/dashboard/queues/emails"
    html = (await admin.get("/dashboard/queues/emails")).text
    assert "Paused queue emails" in html
    assert '<span class="paused-badge">paused</span> claims skip this queue' in html
    assert 'id="queue-resume"' in html


async def test_queue_pages_refuse_what_they_cannot_show(
    app: FastAPI,
    admin: httpx.AsyncClient,
    viewer: httpx.AsyncClient,
    seeded: Seeded,
    dashboard_keys: DashboardKeys,
) -> None:
    assert (await admin.get("/dashboard/queues/nowhere")).status_code == 404
    assert (await admin.get("/dashboard/queues/-bad")).status_code == 404
    shown = await viewer.get("/dashboard/queues/emails")
    assert shown.status_code == 200
    assert "/pause" not in shown.text and "queue-resume" not in shown.text
    async with signed_in(app, dashboard_keys.scoped_viewer) as scoped:
        refused = await scoped.get("/dashboard/queues/emails")
        assert refused.status_code == 403
        assert "not scoped to queue" in refused.text


async def _five_dead(app: FastAPI, secret: str) -> list[int]:
    """Five jobs of queue "picks": three dead, one pending, one running (newest first)."""
    ids = []
    async with api(app, secret) as client:
        for _ in range(3):
            job = (await client.post("/v1/jobs", json={"queue": "picks", "type": "t"})).json()
            claim = {"worker_id": "w", "queues": ["picks"], "max_jobs": 1}
            [held] = (await client.post("/v1/claim", json=claim)).json()["jobs"]
            item = {"job_id": held["id"], "lease_id": held["lease_id"], "retryable": False}
            r = await client.post("/v1/fail", json={"worker_id": "w", "leases": [item]})
            assert r.json()["results"][0]["ok"], r.text
            ids.append(job["id"])
        running = (await client.post("/v1/jobs", json={"queue": "picks", "type": "t"})).json()
        r = await client.post("/v1/claim", json={"worker_id": "w", "queues": ["picks"]})
        assert r.json()["jobs"][0]["id"] == running["id"]
        pending = (await client.post("/v1/jobs", json={"queue": "picks", "type": "t"})).json()
    return [pending["id"], running["id"], *reversed(ids)]


async def test_picked_jobs_are_confirmed_one_by_one_and_exactly_those_change(
    app: FastAPI, admin: httpx.AsyncClient, dashboard_keys: DashboardKeys
) -> None:
    pending, running, dead_c, dead_b, dead_a = await _five_dead(app, dashboard_keys.admin)
    listing = await admin.get("/dashboard/jobs?queue=picks")
    assert '<form id="pick-form" method="get" action="/dashboard/jobs/picked"' in listing.text
    assert listing.text.count('<input type="checkbox" class="pick" name="id"') == 5
    assert 'id="pick-all"' in listing.text
    # Two dead jobs and the running one picked for retry.
    confirm = await admin.get(
        "/dashboard/jobs/picked",
        params=[
            ("action", "retry"),
            ("queue", "picks"),
            ("id", dead_b),
            ("id", running),
            ("id", dead_a),
        ],
    )
    assert confirm.status_code == 200, confirm.text
    html = confirm.text
    count = html.split('id="bulk-count"', 1)[1].split("</p>", 1)[0]
    assert "This will retry <strong>2</strong> of them" in count
    changing = html.split('id="picked-changing"', 1)[1].split("</ul>", 1)[0]
    assert re.findall(r'data-job-id="(\d+)"', changing) == [str(dead_b), str(dead_a)]
    left = html.split('id="picked-left"', 1)[1].split("</ul>", 1)[0]
    assert re.findall(r'data-job-id="(\d+)"', left) == [str(running)]
    assert "state-running" in left
    assert 'id="bulk-confirm" type="submit" class="">Retry 2 jobs</button>' in html
    form = hidden_fields(html)
    assert form["ids_dead"] == f"{dead_b},{dead_a}" and form["queue"] == "picks"
    # Nothing changed yet; then exactly those two.
    assert str(await job_status(app, dead_a)) == "dead"
    done = await admin.post("/dashboard/jobs/picked", data=form)
    assert done.status_code == 303 and done.headers["location"] == "/dashboard/jobs?queue=picks"
    after = await admin.get(done.headers["location"])
    assert '<div id="flash" class="flash flash-ok" role="status">Retried 2 jobs</div>' in after.text
    states = {i: str(await job_status(app, i)) for i in (pending, running, dead_c, dead_b, dead_a)}
    assert states == {
        pending: "pending",
        running: "running",
        dead_c: "dead",
        dead_b: "pending",
        dead_a: "pending",
    }
    # Confirmed again after they changed: each is left alone, and the answer says so.
    again = await admin.post("/dashboard/jobs/picked", data=form)
    landed = await admin.get(again.headers["location"])
    assert "Retried 0 jobs (2 had changed state meanwhile, left alone)" in landed.text


async def test_picked_cancel_takes_waiting_jobs_and_names_the_rest(
    app: FastAPI, admin: httpx.AsyncClient, dashboard_keys: DashboardKeys
) -> None:
    pending, running, dead_c, _, _ = await _five_dead(app, dashboard_keys.admin)
    confirm = await admin.get(
        "/dashboard/jobs/picked",
        params=[
            ("action", "cancel"),
            ("id", pending),
            ("id", running),
            ("id", dead_c),
            ("id", 999999),
        ],
    )
    html = confirm.text
    assert "This will cancel <strong>1</strong> of them" in html
    assert "a running job is cancelled from its own page" in html
    assert "Not found, left alone (1): #999999" in html
    form = hidden_fields(html)
    assert form["ids_pending"] == str(pending) and "ids_running" not in form
    done = await admin.post("/dashboard/jobs/picked", data=form)
    assert done.headers["location"] == "/dashboard/jobs"
    assert str(await job_status(app, pending)) == "cancelled"
    assert str(await job_status(app, running)) == "running"
    assert str(await job_status(app, dead_c)) == "dead"


async def test_picks_that_cannot_be_acted_on_are_refused(
    app: FastAPI, admin: httpx.AsyncClient, viewer: httpx.AsyncClient, dashboard_keys: DashboardKeys
) -> None:
    _, running, dead_c, _, _ = await _five_dead(app, dashboard_keys.admin)
    assert (await admin.get("/dashboard/jobs/picked?action=retry")).status_code == 400
    assert (await admin.get("/dashboard/jobs/picked?action=retry&id=x1")).status_code == 400
    assert (await admin.get(f"/dashboard/jobs/picked?action=delete&id={dead_c}")).status_code == 400
    token = csrf_of((await admin.get("/dashboard/jobs")).text)
    # A running job sent as confirmed for retry (a forged form) changes nothing.
    forged = await admin.post(
        "/dashboard/jobs/picked",
        data={"csrf": token, "action": "retry", "ids_running": str(running)},
    )
    assert forged.status_code == 400
    empty = await admin.post("/dashboard/jobs/picked", data={"csrf": token, "action": "retry"})
    assert empty.status_code == 400
    no_token = await admin.post(
        "/dashboard/jobs/picked", data={"action": "retry", "ids_dead": str(dead_c)}
    )
    assert no_token.status_code == 403
    assert str(await job_status(app, dead_c)) == "dead"
    # Viewers see no checkboxes and may not confirm.
    listing = await viewer.get("/dashboard/jobs?queue=picks")
    assert 'class="pick"' not in listing.text and "pick-form" not in listing.text
    assert (await viewer.get(f"/dashboard/jobs/picked?action=retry&id={dead_c}")).status_code == 403


async def test_a_scoped_admin_cannot_pick_another_teams_jobs(
    app: FastAPI, dashboard_keys: DashboardKeys
) -> None:
    _, _, dead_c, _, _ = await _five_dead(app, dashboard_keys.admin)
    async with signed_in(app, dashboard_keys.scoped_admin) as scoped:
        confirm = await scoped.get(f"/dashboard/jobs/picked?action=retry&id={dead_c}")
        assert "This will retry <strong>0</strong> of them" in confirm.text
        assert f"Not found, left alone (1): #{dead_c}" in confirm.text
        token = csrf_of(confirm.text)
        forged = await scoped.post(
            "/dashboard/jobs/picked",
            data={"csrf": token, "action": "retry", "ids_dead": str(dead_c)},
        )
        landed = await scoped.get(forged.headers["location"])
        assert "Retried 0 jobs" in landed.text
    assert str(await job_status(app, dead_c)) == "dead"


async def test_a_filter_action_says_how_its_count_moved(
    app: FastAPI, admin: httpx.AsyncClient, seeded: Seeded, clean_db: AsyncEngine
) -> None:
    confirm = await admin.get("/dashboard/jobs/bulk?action=cancel&queue=emails")
    assert "<strong>2</strong> jobs" in confirm.text
    assert "The count may move before you confirm" in confirm.text
    form = hidden_fields(confirm.text)
    assert form["confirmed"] == "2"
    # A third job arrives before the button is pressed: it is cancelled too, and said so.
    async with clean_db.begin() as conn:
        await conn.execute(
            text(
                "INSERT INTO jobs (queue, type, max_attempts, lease_seconds) "
                "VALUES ('emails', 'late', 3, 30)"
            )
        )
    done = await admin.post("/dashboard/jobs/bulk", data=form)
    landed = await admin.get(done.headers["location"])
    assert (
        "Cancelled 3 jobs (2 when you confirmed: jobs entered or left the filter since)"
        in landed.text
    )
