"""The dashboard's failures page, a group's retry behind its confirmation, run now, retrying."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator

import httpx
import pytest
from fastapi import FastAPI

from tests.api.dashboard import DashboardKeys, api, csrf_of, signed_in
from tests.api.helpers import lease
from tests.failure_scene import CAUSES, JOBS_PER_CAUSE, fail_scene


@pytest.fixture
async def admin(app: FastAPI, dashboard_keys: DashboardKeys) -> AsyncIterator[httpx.AsyncClient]:
    async with signed_in(app, dashboard_keys.admin) as client:
        yield client


async def _fail(
    client: httpx.AsyncClient, message: str, retry_after: float | None = None, **fields: object
) -> int:
    job = (await client.post("/v1/jobs", json={"queue": "sync", "type": "pull", **fields})).json()
    [held] = (await client.post("/v1/claim", json={"worker_id": "w", "queues": ["sync"]})).json()[
        "jobs"
    ]
    error = {"type": "KeyError", "message": message, "traceback": f"Traceback\nKeyError: {message}"}
    item = lease(held, error=error)
    if retry_after is not None:
        item["retry_after_seconds"] = retry_after
    r = await client.post("/v1/fail", json={"worker_id": "w", "leases": [item]})
    assert r.status_code == 200 and r.json()["results"][0]["ok"]
    return int(job["id"])


async def test_a_failure_group_is_listed_confirmed_with_its_jobs_and_retried(
    app: FastAPI, admin: httpx.AsyncClient, dashboard_keys: DashboardKeys
) -> None:
    async with api(app, dashboard_keys.admin) as client:
        dead = [await _fail(client, f"'row-{n}'", max_attempts=1) for n in range(3)]
        # Retried an hour out: a backoff drawn short would let the promoter make it pending
        # before the check below on a slow machine.
        waiting = await _fail(client, "'row-9'", retry_after=3600, max_attempts=3)
    page = await admin.get("/dashboard/failures")
    assert page.status_code == 200
    html = page.text
    [row] = re.findall(r'<tr class="failure-group".*?</tr>', html, re.S)
    assert '<strong class="error-type">KeyError</strong>' in row
    assert "&#39;?&#39;" in row  # the masked pattern, escaped
    assert '<td class="num failures">4</td>' in row
    link = re.search(r'href="(/dashboard/failures/group\?action=retry&amp;[^"]+)"', row)
    assert link is not None
    confirm = await admin.get(link.group(1).replace("&amp;", "&"))
    assert confirm.status_code == 200
    assert re.search(r"This will retry <strong>3</strong> jobs", confirm.text)
    ids = re.search(r'name="ids" value="([0-9,]+)"', confirm.text)
    assert ids is not None and sorted(int(i) for i in ids.group(1).split(",")) == dead
    fields = dict(
        re.findall(r'<input type="hidden" name="([a-z_]+)" value="([^"]*)"', confirm.text)
    )
    fields = {k: v.replace("&#39;", "'") for k, v in fields.items()}
    done = await admin.post("/dashboard/failures/group", data=fields)
    assert done.status_code == 303
    after = await admin.get(done.headers["location"])
    assert "Retried 3 jobs" in after.text
    async with api(app, dashboard_keys.admin) as client:
        states = [(await client.get(f"/v1/jobs/{i}")).json()["status"] for i in dead]
        assert states == ["pending"] * 3
        assert (await client.get(f"/v1/jobs/{waiting}")).json()["retrying"] is True
    viewer_page = await admin.get("/dashboard/failures")
    assert viewer_page.status_code == 200


async def test_a_viewer_sees_failures_but_no_group_actions(
    app: FastAPI, dashboard_keys: DashboardKeys
) -> None:
    async with api(app, dashboard_keys.admin) as client:
        await _fail(client, "'x'", max_attempts=1)
    async with signed_in(app, dashboard_keys.viewer) as viewer:
        html = (await viewer.get("/dashboard/failures")).text
        assert 'class="failure-group"' in html and "group-retry" not in html
        refused = await viewer.get(
            "/dashboard/failures/group?action=retry&queue=sync&type=pull&error_type=KeyError"
            f"&fingerprint=m:{'0' * 32}"
        )
        assert refused.status_code == 403


async def test_a_retrying_job_shows_as_retrying_and_runs_now_from_its_page(
    app: FastAPI, admin: httpx.AsyncClient, dashboard_keys: DashboardKeys
) -> None:
    async with api(app, dashboard_keys.admin) as client:
        job_id = await _fail(client, "'currency'", retry_after=3600, max_attempts=3)
    page = await admin.get(f"/dashboard/jobs/{job_id}")
    assert 'id="job-status">retrying</span>' in page.text
    assert "KeyError: &#39;currency&#39;" in page.text
    assert '<details class="traceback"><summary>Traceback</summary>' in page.text
    listed = await admin.get("/dashboard/jobs?state=retrying")
    assert f'data-job-id="{job_id}"' in listed.text
    ran = await admin.post(f"/dashboard/jobs/{job_id}/run-now", data={"csrf": csrf_of(page.text)})
    assert ran.status_code == 303
    after = (await admin.get(ran.headers["location"])).text
    assert f"Job {job_id} is due now" in after
    assert 'id="job-status">pending</span>' in after
    assert "run now by admin" in after


async def test_the_failures_page_shows_one_row_per_cause_and_retries_exactly_one(
    app: FastAPI, admin: httpx.AsyncClient, dashboard_keys: DashboardKeys
) -> None:
    """Issue 40: the page showed one mailbox error as dozens of rows of one job each, and
    "Retry group" acted on one job a row; it shows one row per cause of the scene."""
    async with api(app, dashboard_keys.admin) as client:
        ids = await fail_scene(client)
    html = (await admin.get("/dashboard/failures")).text
    rows = re.findall(r'<tr class="failure-group".*?</tr>', html, re.S)
    assert len(rows) == len(CAUSES)
    assert all(f'<td class="num failures">{JOBS_PER_CAUSE}</td>' in row for row in rows)
    # The same KeyError from two code paths: two rows, each saying where it was raised.
    key_errors = [row for row in rows if 'data-error-type="KeyError"' in row]
    assert len(key_errors) == 2
    [sync] = [row for row in key_errors if "sync/users.py in pull_user" in row]
    assert "billing/invoices.py in build_invoice" not in sync
    link = re.search(r'href="(/dashboard/failures/group\?action=retry&amp;[^"]+)"', sync)
    assert link is not None
    confirm = await admin.get(link.group(1).replace("&amp;", "&"))
    assert confirm.status_code == 200
    assert f"This will retry <strong>{JOBS_PER_CAUSE}</strong> jobs" in confirm.text
    assert "sync/users.py in pull_user" in confirm.text
    listed = re.search(r'name="ids" value="([0-9,]+)"', confirm.text)
    assert listed is not None
    assert sorted(int(i) for i in listed.group(1).split(",")) == ids["user missing (sync)"]
    fields = dict(
        re.findall(r'<input type="hidden" name="([a-z_]+)" value="([^"]*)"', confirm.text)
    )
    done = await admin.post("/dashboard/failures/group", data=fields)
    assert done.status_code == 303
    after = await admin.get(done.headers["location"])
    assert f"Retried {JOBS_PER_CAUSE} jobs" in after.text
    async with api(app, dashboard_keys.admin) as client:
        for job_id in ids["user missing (invoice)"][:5]:
            assert (await client.get(f"/v1/jobs/{job_id}")).json()["status"] == "dead"
