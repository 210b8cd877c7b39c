"""A queue's own page and jobs picked one by one (issue 20, item 6), in headless Chromium against a
real ``jobq serve``.

From the overview to a queue's page with its chart, failure rates and percentiles; the page at a
phone's width and a desktop's; ticking two jobs of five, retrying them through the confirmation,
and only those two changing, while the list's auto-refresh waits for the ticks. Each test works
on queues of its own.
"""

from __future__ import annotations

import asyncio
import re

import pytest
from playwright.async_api import Page, expect

from tests.polling import poll_until
from tests.system.browser.conftest import Dashboard, PageLog, Steps
from tests.system.browser.helpers import (
    claim,
    enqueue_many,
    get_job,
    lease,
    lease_call,
    queue_cell,
    run_to_dead,
    sign_in,
)

pytestmark = pytest.mark.browser

PHONE = {"width": 390, "height": 844}
DESKTOP = {"width": 1440, "height": 900}
REFRESH_SECONDS = 2.0  # JOBQ_DASHBOARD_REFRESH_SECONDS of the browser tests' server (conftest)
REFRESH_WITHIN_MS = (REFRESH_SECONDS + 5) * 1000


async def page_width(page: Page) -> int:
    """How wide the page's content is: wider than the window means it scrolls sideways."""
    width: int = await page.evaluate("document.documentElement.scrollWidth")
    return width


async def busy_queue(dashboard: Dashboard, queue: str) -> None:
    """Four jobs done (each ran about a tenth of a second), one failed once then done, one dead."""
    api = dashboard.api
    await enqueue_many(api, queue, 4, type="export")
    held = await claim(api, queue, max_jobs=4)
    await asyncio.sleep(0.1)
    await lease_call(api, "complete", "browser-worker", [lease(j) for j in held])
    await enqueue_many(api, queue, 1, type="export", max_attempts=3)
    (flaky,) = await claim(api, queue)
    await lease_call(
        api, "fail", "browser-worker", [lease(flaky, error="timeout", retry_after_seconds=0)]
    )
    (again,) = await claim(api, queue, wait_seconds=5)
    await lease_call(api, "complete", "browser-worker", [lease(again)])
    await run_to_dead(api, queue, [("browser-worker", "boom")], type="export")


async def test_a_queue_page_from_the_overview(
    dashboard: Dashboard, page: Page, steps: Steps
) -> None:
    queue = "qp-exports"
    await busy_queue(dashboard, queue)
    await sign_in(page, dashboard.admin_key)
    await expect(queue_cell(page, queue, "succeeded")).to_have_text("5")
    await page.locator(f'table#queues tr[data-queue="{queue}"] a.queue-link').click()
    await expect(page).to_have_url(re.compile(rf"/dashboard/queues/{queue}$"))
    await expect(page.locator("#queue-name")).to_have_text(queue)
    await expect(page.locator('#queue-counts [data-col="succeeded"] a.count')).to_have_text("5")
    await expect(page.locator('#queue-counts [data-col="dead"] a.count')).to_have_text("1")

    # The overview's chart, for this queue: its successes, the failed attempt and the dead job.
    chart = page.locator("svg#throughput")
    await expect(chart).to_be_visible()
    await expect(chart).to_have_attribute(
        "aria-label", re.compile(r"5 succeeded, 1 failed attempts, 1 dead")
    )
    await expect(page.locator("figure.chart figcaption")).to_contain_text(f"of queue {queue}")

    hour = '[data-window="3600"]'
    await expect(page.locator(f'#queue-rates td{hour}[data-col="dead_rate"]')).to_have_text(
        "16.7 % (1 of 6)"
    )
    # Attempts: five succeeded jobs (one of them on its second), the dead one's single attempt.
    await expect(
        page.locator(f'#queue-rates td{hour}[data-col="failed_attempt_rate"]')
    ).to_have_text("28.6 % (2 of 7)")
    run = page.locator(f'#queue-timings tr[data-figure="run"]{hour}')
    await expect(run.locator('[data-col="jobs"]')).to_have_text("6")
    for column in ("p50", "p95", "p99"):
        await expect(run.locator(f'[data-col="{column}"]')).to_have_text(
            re.compile(r"\d+(\.\d+)? (ms|s)")
        )
    wait = page.locator(f'#queue-timings tr[data-figure="wait"]{hour}')
    await expect(wait.locator('[data-col="p50"]')).to_have_text(re.compile(r"\d+(\.\d+)? (ms|s)"))
    await steps.shot(page, "queue-page")

    # Each count leads to those jobs.
    await page.locator('#queue-counts [data-col="dead"] a.count').click()
    await expect(page).to_have_url(re.compile(rf"/dashboard/jobs\?queue={queue}&state=dead$"))
    await expect(page.locator("table#jobs tr[data-job-id]")).to_have_count(1)


@pytest.mark.parametrize("viewport", [PHONE, DESKTOP], ids=["390px", "1440px"])
async def test_the_queue_page_and_the_picks_fit_the_screen(
    dashboard: Dashboard, page: Page, steps: Steps, viewport: dict[str, int]
) -> None:
    queue = "qp-a-rather-long-queue-name-for-a-narrow-screen"
    await busy_queue(dashboard, queue)
    await page.set_viewport_size(viewport)
    await sign_in(page, dashboard.admin_key)
    for path in (f"/dashboard/queues/{queue}", f"/dashboard/jobs?queue={queue}"):
        await page.goto(path)
        await expect(page.locator("main h1")).to_be_visible()
        width = await page_width(page)
        assert width <= viewport["width"], f"{path} is {width} px wide at {viewport['width']} px"
        await expect(page.locator("#sign-out")).to_be_in_viewport()
        await steps.shot(page, f"{viewport['width']}-{'queue' if 'queues' in path else 'jobs'}")
    # The confirmation of picked jobs too.
    await page.locator("table#jobs input.pick").first.check()
    await page.locator("#picked-retry").click()
    await expect(page.locator("#bulk-count")).to_contain_text("This will retry 1 of them")
    width = await page_width(page)
    assert width <= viewport["width"], f"the confirmation is {width} px wide"
    await steps.shot(page, f"{viewport['width']}-picked-confirm")


def fragment_requests(page_log: PageLog) -> int:
    """The jobs list's refreshes sent so far."""
    return sum(1 for url in page_log.urls() if "/dashboard/fragments/jobs" in url)


async def test_two_jobs_of_five_are_picked_retried_and_only_they_change(
    dashboard: Dashboard, page: Page, page_log: PageLog, steps: Steps
) -> None:
    api, queue = dashboard.api, "qp-picks"
    dead = [await run_to_dead(api, queue, [("browser-worker", f"boom {n}")]) for n in range(5)]
    ids = sorted((job["id"] for job in dead), reverse=True)  # as the list shows them
    await sign_in(page, dashboard.admin_key)
    await page.goto(f"/dashboard/jobs?queue={queue}")
    rows = page.locator("table#jobs tr[data-job-id]")
    await expect(rows).to_have_count(5)
    await expect(page.locator("#picked-retry")).to_be_disabled()
    # The list refreshes itself while nothing is ticked.
    await poll_until(lambda: fragment_requests(page_log) > 0, within=10, what="the list to refresh")

    picked = [ids[1], ids[3]]
    for job_id in picked:
        await page.locator(f'tr[data-job-id="{job_id}"] input.pick').check()
    await expect(page.locator("#picked-count")).to_have_text("2")
    await expect(page.locator("#picked-paused")).to_be_visible()
    await expect(page.locator("#pick-all")).not_to_be_checked()
    # Ticked, the list waits: no refresh for a few intervals, and the ticks stay.
    await poll_until(lambda: page_log.in_flight() == 0, what="requests in flight to finish")
    before = fragment_requests(page_log)
    await asyncio.sleep(2.5 * REFRESH_SECONDS)
    assert fragment_requests(page_log) == before, "the list refreshed under the ticks"
    for job_id in picked:
        await expect(page.locator(f'tr[data-job-id="{job_id}"] input.pick')).to_be_checked()
    await steps.shot(page, "two-ticked")

    await page.locator("#picked-retry").click()
    await expect(page).to_have_url(re.compile(r"/dashboard/jobs/picked\?"))
    await expect(page.locator("#bulk-count")).to_contain_text("This will retry 2 of them")
    changing = page.locator("#picked-changing li[data-job-id]")
    await expect(changing).to_have_count(2)
    assert {int(i) for i in await changing.evaluate_all("l => l.map(e => e.dataset.jobId)")} == set(
        picked
    )
    await expect(page.locator("#bulk-confirm")).to_have_text("Retry 2 jobs")
    await steps.shot(page, "confirm")
    await page.locator("#bulk-confirm").click()
    await expect(page.locator("#flash")).to_have_text("Retried 2 jobs")
    await expect(page).to_have_url(re.compile(rf"/dashboard/jobs\?queue={queue}$"))
    await steps.shot(page, "retried")

    for job_id in ids:
        status = (await get_job(api, job_id))["status"]
        assert status == ("pending" if job_id in picked else "dead"), (job_id, status)


async def test_select_all_ticks_the_page_and_unticking_resumes_the_refresh(
    dashboard: Dashboard, page: Page, page_log: PageLog, steps: Steps
) -> None:
    api, queue = dashboard.api, "qp-select-all"
    await enqueue_many(api, queue, 3)
    await sign_in(page, dashboard.admin_key)
    await page.goto(f"/dashboard/jobs?queue={queue}")
    boxes = page.locator("table#jobs input.pick")
    await expect(boxes).to_have_count(3)
    await page.locator("#pick-all").check()
    await expect(page.locator("#picked-count")).to_have_text("3")
    for index in range(3):
        await expect(boxes.nth(index)).to_be_checked()
    await steps.shot(page, "all-ticked")
    # A job enqueued now does not appear while the ticks hold the list...
    await enqueue_many(api, queue, 1)
    await asyncio.sleep(1.5 * REFRESH_SECONDS)
    await expect(boxes).to_have_count(3)
    # ...and does once they are cleared: the list refreshes at once.
    await page.locator("#pick-all").uncheck()
    await expect(page.locator("#picked-count")).to_have_text("0")
    await expect(page.locator("#picked-cancel")).to_be_disabled()
    await expect(page.locator("#picked-paused")).to_be_hidden()
    await expect(boxes).to_have_count(4, timeout=REFRESH_WITHIN_MS)
    await page.locator("#pick-all").check()
    await page.locator("#picked-cancel").click()
    await expect(page.locator("#bulk-count")).to_contain_text("This will cancel 4 of them")
    await page.locator("#bulk-confirm").click()
    await expect(page.locator("#flash")).to_have_text("Cancelled 4 jobs")
