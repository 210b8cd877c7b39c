"""The dashboard during an incident (issue 20), in headless Chromium against a real ``jobq serve``.

A job's history with its actors, failures grouped by cause and a group's retry, run now on a
retrying job, and the pages at a phone's width. Each test works on queues of its own.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

import pytest
from playwright.async_api import Page, expect

from tests.system.browser.conftest import Dashboard, Steps
from tests.system.browser.helpers import claim, enqueue, get_job, lease, lease_call, sign_in

pytestmark = pytest.mark.browser

PHONE = {"width": 390, "height": 844}
# The workers page refreshes every 2 s (the browser tests' server), sightings are written every
# 5 s: room for both and a loaded machine.
REFRESH_WITHIN_MS = 20_000
DESKTOP = {"width": 1440, "height": 900}


def key_error(message: str) -> dict[str, Any]:
    return {
        "type": "KeyError",
        "message": message,
        "traceback": 'Traceback (most recent call last):\n  File "sync.py", line 7, in run\n'
        f"    rate = row[{message}]\nKeyError: {message}",
    }


async def page_width(page: Page) -> int:
    """How wide the page's content is: wider than the window means it scrolls sideways."""
    width: int = await page.evaluate("document.documentElement.scrollWidth")
    return width


async def test_a_jobs_history_shows_every_step_with_who_made_it(
    dashboard: Dashboard, page: Page, steps: Steps
) -> None:
    api, queue = dashboard.api, "i-history"
    job = await enqueue(api, queue, type="report", max_attempts=3, priority=1000)
    (first,) = await claim(api, queue, worker="host-a:1")
    await lease_call(api, "release", "host-a:1", [lease(first, checkpoint={"page": 4})])
    (second,) = await claim(api, queue, worker="host-b:2")
    await lease_call(
        api,
        "fail",
        "host-b:2",
        [lease(second, error=key_error("'currency'"), retryable=False)],
    )
    assert (await api.post(f"/v1/jobs/{job['id']}/retry")).status_code == 200
    (third,) = await claim(api, queue, worker="host-c:3")
    await lease_call(api, "complete", "host-c:3", [lease(third, result={"rows": 9})])

    await sign_in(page, dashboard.admin_key)
    await page.goto(f"/dashboard/jobs/{job['id']}")
    await expect(page.locator("#job-status")).to_have_text("succeeded")
    timeline = page.locator("ol#job-timeline > li")
    expected = [
        "enqueued in i-history",
        "attempt 1 claimed by host-a:1",
        "attempt 1 released by the worker (checkpoint saved), pending again",
        "attempt 1 claimed by host-b:2",
        "attempt 1 failed: KeyError: 'currency' — dead: not retryable",
        "retried by ops-admin (was dead)",
        "attempt 1 claimed by host-c:3",
        "attempt 1 completed",
    ]
    await expect(timeline).to_have_count(len(expected))
    for item, text in zip(await timeline.all(), expected, strict=True):
        await expect(item.locator(".what")).to_contain_text(text)
    failed = timeline.nth(4)
    await expect(failed).to_have_class("tl-dead")
    await failed.locator("details.traceback summary").click()
    await expect(failed.locator("details.traceback pre")).to_contain_text("rate = row['currency']")
    error = page.locator("ol#job-errors li.job-error").first
    await expect(error.locator(".exception-line")).to_have_text("KeyError: 'currency'")
    await steps.shot(page, "history")


async def test_failures_are_grouped_and_a_group_is_retried_after_confirmation(
    dashboard: Dashboard, page: Page, steps: Steps
) -> None:
    api, queue = dashboard.api, "i-failures"
    dead = []
    for currency in ("'EUR'", "'USD'", "'JPY'"):
        job = await enqueue(api, queue, type="sync", max_attempts=1, priority=1000)
        (held,) = await claim(api, queue)
        await lease_call(api, "fail", "browser-worker", [lease(held, error=key_error(currency))])
        dead.append(job["id"])

    await sign_in(page, dashboard.admin_key)
    await page.locator("a#nav-failures").click()
    group = page.locator("tr.failure-group").filter(has_text=queue)
    await expect(group).to_have_count(1)
    await expect(group.locator(".error-type")).to_have_text("KeyError")
    await expect(group.locator(".pattern")).to_have_text("'?'")
    await expect(group.locator("td.failures")).to_have_text("3")
    await steps.shot(page, "failures")
    await group.locator("a.group-retry").click()
    await expect(page.locator("#bulk-count")).to_contain_text("This will retry 3 jobs")
    await steps.shot(page, "group-confirm")
    await page.locator("button#bulk-confirm").click()
    await expect(page.locator("#flash")).to_have_text("Retried 3 jobs")
    for job_id in dead:
        assert (await get_job(api, job_id))["status"] == "pending"


async def test_run_now_on_a_retrying_job(dashboard: Dashboard, page: Page, steps: Steps) -> None:
    api, queue = dashboard.api, "i-run-now"
    job = await enqueue(api, queue, max_attempts=5, priority=1000)
    (held,) = await claim(api, queue)
    await lease_call(
        api, "fail", "browser-worker", [lease(held, error="busy", retry_after_seconds=3600)]
    )

    await sign_in(page, dashboard.admin_key)
    await page.goto(f"/dashboard/jobs?queue={queue}&state=retrying")
    row = page.locator(f'tr[data-job-id="{job["id"]}"]')
    await expect(row.locator(".state")).to_have_text("retrying")
    await row.locator("a.job-link").click()
    await expect(page.locator("#job-status")).to_have_text("retrying")
    await page.locator("button#job-run-now").click()
    await expect(page.locator("#flash")).to_have_text(f"Job {job['id']} is due now")
    await expect(page.locator("#job-status")).to_have_text("pending")
    await expect(page.locator("ol#job-timeline")).to_contain_text("run now by ops-admin")
    await steps.shot(page, "run-now")
    assert (await get_job(api, job["id"]))["status"] == "pending"


@pytest.mark.parametrize("viewport", [PHONE, DESKTOP], ids=["390px", "1440px"])
async def test_the_pages_fit_the_screen_without_sideways_scrolling(
    dashboard: Dashboard, page: Page, steps: Steps, viewport: dict[str, int]
) -> None:
    api, queue = dashboard.api, "i-a-rather-long-queue-name-for-a-narrow-screen"
    job = await enqueue(
        api, queue, type="export-customer-ledger-to-the-warehouse", payload={"x": "y" * 300}
    )
    (held,) = await claim(api, queue)
    await lease_call(
        api, "fail", "browser-worker", [lease(held, error=key_error("'" + "k" * 200 + "'"))]
    )
    await page.set_viewport_size(viewport)
    await sign_in(page, dashboard.admin_key)
    for path in (
        "/dashboard",
        "/dashboard/jobs",
        f"/dashboard/jobs/{job['id']}",
        "/dashboard/failures",
        "/dashboard/workers",
        "/dashboard/limits",
        "/dashboard/schedules",
        "/dashboard/audit",
    ):
        await page.goto(path)
        await expect(page.locator("main h1")).to_be_visible()
        width = await page_width(page)
        assert width <= viewport["width"], f"{path} is {width} px wide at {viewport['width']} px"
        await expect(page.locator("#sign-out")).to_be_in_viewport()
        slug = re.sub(r"\W+", "-", path.strip("/")) or "overview"
        await steps.shot(page, f"{viewport['width']}-{slug}")


async def test_a_pending_job_held_by_its_key_says_so(
    dashboard: Dashboard, page: Page, steps: Steps
) -> None:
    api, queue = dashboard.api, "i-keys"
    r = await api.put("/v1/limits", json={"scope": "key", "pattern": "tenant:*", "max_running": 2})
    assert r.status_code in (200, 201), r.text
    jobs = [await enqueue(api, queue, concurrency_key="tenant:42", priority=1000) for _ in range(3)]
    taken = await claim(api, queue, max_jobs=3)
    assert len(taken) == 2
    (waiting,) = [j for j in jobs if j["id"] not in {t["id"] for t in taken}]

    await sign_in(page, dashboard.admin_key)
    await page.goto(f"/dashboard/jobs/{waiting['id']}")
    await expect(page.locator("#job-status")).to_have_text("pending")
    blocker = page.locator('#job-blockers li[data-kind="key_limit"]')
    await expect(blocker).to_have_text("key tenant:42 at 2/2")
    await steps.shot(page, "blocked-by-key")
    await page.locator("a#nav-limits").click()
    row = page.locator('#limits tr[data-pattern="tenant:*"]')
    await expect(row.locator('[data-col="running"]')).to_have_text("2")
    await expect(row.locator('[data-col="held_back"]')).to_have_text("1")
    await steps.shot(page, "limits")
    await row.locator("button.limit-delete").click()
    await expect(page.locator("#flash")).to_have_text("Deleted the key limit tenant:*")


async def test_the_workers_page_shows_an_idle_long_polling_worker(
    dashboard: Dashboard, page: Page, steps: Steps
) -> None:
    api = dashboard.api
    # A long poll on an empty queue: the worker waits, idle, and is seen.
    polling = asyncio.ensure_future(claim(api, "i-idle", worker="idle-poller", wait_seconds=15))
    await sign_in(page, dashboard.admin_key)
    await page.locator("a#nav-workers").click()
    row = page.locator('tr[data-worker-id="idle-poller"]')
    # The sightings are written every few seconds and the page refreshes itself.
    await expect(row).to_have_attribute("data-state", "idle", timeout=REFRESH_WITHIN_MS)
    await expect(row.locator("td.queues")).to_have_text("i-idle")
    await steps.shot(page, "idle-worker")
    await enqueue(api, "i-idle")
    assert len(await polling) == 1


async def test_a_schedule_is_paused_and_triggered_from_the_dashboard_with_its_queue_paused_warned(
    dashboard: Dashboard, page: Page, steps: Steps
) -> None:
    api = dashboard.api
    schedule = {"interval_seconds": 3600, "template": {"queue": "i-digests", "type": "digest"}}
    assert (await api.put("/v1/schedules/i-digest", json=schedule)).status_code in (200, 201)
    assert (await api.put("/v1/queues/i-digests", json={"paused": True})).status_code in (200, 201)
    await sign_in(page, dashboard.admin_key)
    await page.locator("a#nav-schedules").click()
    row = page.locator('tr[data-schedule="i-digest"]')
    await expect(row.locator(".queue-paused")).to_have_text("queue paused")
    await row.locator("button.schedule-pause").click()
    await expect(page.locator("#flash")).to_have_text("Paused schedule i-digest")
    await expect(row.locator("button.schedule-resume")).to_be_visible()
    await steps.shot(page, "schedule-paused")
    paused = (await api.get("/v1/schedules/i-digest")).json()
    assert paused["paused"] is True

    # Trigger now: one job from the template, even paused, and the schedule stays as it was.
    await row.locator("button.schedule-trigger").click()
    flash = page.locator("#flash")
    await expect(flash).to_have_text(re.compile(r"^Triggered schedule i-digest: job \d+$"))
    job_id = int((await page.locator("#flash-job").inner_text()).removeprefix("job "))
    await steps.shot(page, "schedule-triggered")
    job = await get_job(api, job_id)
    assert (job["queue"], job["type"], job["status"]) == ("i-digests", "digest", "pending")
    assert (await api.get("/v1/schedules/i-digest")).json() == paused
    audit = (await api.get("/v1/audit", params={"action": "schedule.trigger"})).json()
    assert [e["job_id"] for e in audit["entries"]] == [job_id]
    await page.locator("#flash-job").click()
    await expect(page.locator("#job-status")).to_have_text("pending")
