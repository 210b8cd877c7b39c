"""The dashboard in headless Chromium against a real ``jobq serve``, seeded through the HTTP API.

Each test works on queues of its own, so the tests share one server without seeing each other's
jobs. Every step leaves a screenshot in the artifacts folder (see ``conftest.py``); the tour at
the top, run first on the still-empty database, also makes the docs' screenshots when
``JOBQ_SCREENSHOTS=1``.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any
from urllib.parse import urlsplit

import pytest
from playwright.async_api import BrowserContext, Page, expect

from tests.polling import poll_until
from tests.system.browser.conftest import Dashboard, PageLog, Steps
from tests.system.browser.helpers import (
    claim,
    enqueue,
    enqueue_batch,
    enqueue_many,
    get_job,
    lease,
    lease_call,
    queue_cell,
    queue_stats,
    run_to_dead,
    sign_in,
)

pytestmark = pytest.mark.browser

COUNT_COLUMNS = ("scheduled", "pending", "running", "succeeded", "dead", "cancelled")
REFRESH_SECONDS = 2.0  # the overview's htmx poll (JOBQ_DASHBOARD_REFRESH_SECONDS in conftest)
REFRESH_WITHIN_MS = (REFRESH_SECONDS + 5) * 1000  # one poll plus room for a loaded CI machine


async def listed_job_ids(page: Page) -> set[int]:
    """The ids of the jobs in ``table#jobs`` now."""
    ids = await page.locator("table#jobs tr[data-job-id]").evaluate_all(
        "rows => rows.map(row => row.dataset.jobId)"
    )
    return {int(i) for i in ids}


async def show_jobs(page: Page, ids: set[int]) -> None:
    """Waits until the listing shows exactly the jobs ``ids``."""

    async def shown() -> bool:
        return await listed_job_ids(page) == ids

    await poll_until(shown, within=10, what=f"the jobs table to list exactly {sorted(ids)}")


async def filter_jobs(page: Page, **fields: str) -> None:
    """Fills the job filters (``queue``, ``state``, ``type``, ``payload``) and applies them."""
    form = page.locator("form#job-filters")
    for name, value in fields.items():
        if name == "state":
            await form.locator("select[name=state]").select_option(value)
        else:
            await form.locator(f"input[name={name}]").fill(value)
    await page.locator("#apply-filters").click()


def number(n: int) -> re.Pattern[str]:
    """Text holding the number ``n`` as a whole word (``4`` in "4 jobs", not in "14" or "0.4")."""
    return re.compile(rf"(?<![\d.]){n}(?![\d.])")


# -- the tour: every page on realistic data (the docs' screenshots) ---------------------------


async def seed_tour(dashboard: Dashboard) -> dict[str, Any]:
    """Queues, workers and outcomes that look like a working service; answers the dead job.

    Workers claim with their team's key (``mailer``, ``reporting``), as real ones would.
    """
    api = dashboard.api
    async with dashboard.client("mailer") as mailer, dashboard.client("reporting") as reporting:
        dead = await run_to_dead(
            api,
            "emails",
            [
                ("mail-1:4711", "SMTP 451 4.7.1 greylisted, try again later"),
                ("mail-2:4712", "SMTP 550 5.1.1 <ada@example.com>: user unknown"),
            ],
            worker_api=mailer,
            priority=0,
            type="welcome",
            payload={"to": "ada@example.com", "template": "welcome"},
        )
        welcomes = [{"to": f"user{n}@example.com", "template": "welcome"} for n in range(18)]
        await enqueue_batch(api, "emails", welcomes, type="welcome")
        sent = await claim(mailer, "emails", worker="mail-1:4711", max_jobs=12)
        results = [lease(j, result={"message_id": f"<{j['id']}@mx.example.com>"}) for j in sent]
        await lease_call(mailer, "complete", "mail-1:4711", results)
        await claim(mailer, "emails", worker="mail-2:4712", max_jobs=2)
        await enqueue(api, "emails", type="digest", delay_seconds=3600, payload={"week": 49})

        months = [{"account": 100 + n, "month": "2026-11"} for n in range(4)]
        await enqueue_batch(api, "reports", months, type="monthly")
        (report,) = await claim(reporting, "reports", worker="report-7:2201")
        progress = {"done": 48, "total": 120}
        await lease_call(
            reporting,
            "heartbeat",
            "report-7:2201",
            [lease(report, checkpoint={"row": 48_000}, progress=progress)],
        )
    cancel = await enqueue(
        api, "reports", type="monthly", payload={"account": 7, "month": "2026-10"}
    )
    assert (await api.post(f"/v1/jobs/{cancel['id']}/cancel")).status_code == 200
    invoices = [{"invoice": f"INV-{2041 + n}"} for n in range(5)]
    await enqueue_batch(api, "billing.invoices", invoices, type="invoice")
    assert (await api.post("/v1/queues/billing.invoices/pause")).status_code == 200
    return dead


async def seed_workflow(dashboard: Dashboard) -> dict[str, Any]:
    """A nightly ETL workflow: both extracts succeeded, the join running, the rest waiting."""
    steps = [
        {"name": "extract-orders", "queue": "etl", "type": "extract"},
        {"name": "extract-refunds", "queue": "etl", "type": "extract"},
        {
            "name": "join",
            "after": ["extract-orders", "extract-refunds"],
            "queue": "etl",
            "type": "join",
        },
        {"name": "load-warehouse", "after": ["join"], "queue": "etl", "type": "load"},
        {"name": "sales-report", "after": ["join"], "queue": "reports", "type": "monthly"},
        {
            "name": "notify-finance",
            "after": ["load-warehouse", "sales-report"],
            "queue": "emails",
            "type": "notify",
        },
    ]
    r = await dashboard.api.post("/v1/workflows", json={"name": "nightly-sales", "steps": steps})
    assert r.status_code == 201, r.text
    extracts = await claim(dashboard.api, "etl", worker="etl-1:3100", max_jobs=2)
    assert {j["type"] for j in extracts} == {"extract"}
    await lease_call(dashboard.api, "complete", "etl-1:3100", [lease(j) for j in extracts])
    (join,) = await claim(dashboard.api, "etl", worker="etl-1:3100")
    assert join["type"] == "join"
    workflow: dict[str, Any] = r.json()
    return workflow


async def test_tour_of_every_page(dashboard: Dashboard, page: Page, steps: Steps) -> None:
    """Overview, jobs, a failed job, workers, failures, a queue and the overview on a phone render
    the seeded service (the docs' screenshots)."""
    dead = await seed_tour(dashboard)
    await sign_in(page, dashboard.admin_key)
    for queue in ("emails", "reports", "billing.invoices"):
        await expect(page.locator(f'table#queues tr[data-queue="{queue}"]')).to_be_visible()
    await expect(queue_cell(page, "emails", "succeeded")).to_have_text("12")
    await expect(page.locator("svg#throughput")).to_be_visible()
    await expect(
        page.locator('tr[data-queue="billing.invoices"] span.paused-badge')
    ).to_be_visible()
    await steps.readme(page, "overview")

    await page.locator("a#nav-jobs").click()
    await expect(page.locator("table#jobs tr[data-job-id]").first).to_be_visible()
    await steps.readme(page, "jobs")

    await page.goto(f"/dashboard/jobs/{dead['id']}")
    await expect(page.locator("#job-status")).to_have_text("dead")
    await expect(page.locator("ol#job-errors li.job-error")).to_have_count(2)
    await steps.readme(page, "job-failed")

    await page.locator("a#nav-workers").click()
    for worker, key_name in (("mail-2:4712", "mailer"), ("report-7:2201", "reporting")):
        row = page.locator(f'table#workers tr[data-worker-id="{worker}"]')
        await expect(row).to_contain_text(key_name)  # the key it claimed with
    # mail-1 holds nothing any more: not busy (listed as idle once its sighting is written,
    # every few seconds, or not yet listed)
    await expect(
        page.locator('table#workers tr[data-worker-id="mail-1:4711"][data-state="busy"]')
    ).to_have_count(0)
    await steps.readme(page, "workers")

    # The dead job's two failures, grouped by cause (two SMTP messages, two groups).
    await page.locator("a#nav-failures").click()
    await expect(page.locator("table#failure-groups tbody tr")).to_have_count(2)
    await steps.readme(page, "failures")

    await page.goto("/dashboard/queues/emails")
    await expect(page.locator("table#queue-timings")).to_be_visible()
    await steps.readme(page, "queue")

    # The same overview on a phone: nothing off-screen.
    await page.set_viewport_size({"width": 390, "height": 844})
    await page.locator("a#nav-overview").click()
    await expect(page.locator('table#queues tr[data-queue="emails"]')).to_be_visible()
    width = await page.evaluate("document.documentElement.scrollWidth")
    assert width <= 390, width
    await steps.readme(page, "overview-phone")

    # A workflow part way through: two extracts done, the join running, the rest waiting.
    workflow = await seed_workflow(dashboard)
    await page.set_viewport_size({"width": 1280, "height": 800})
    await page.goto(f"/dashboard/workflows/{workflow['id']}")
    await expect(page.locator("svg#workflow-graph g.wf-node")).to_have_count(6)
    await expect(page.locator("svg#workflow-graph path.wf-edge")).to_have_count(6)
    await expect(page.locator("#workflow-state")).to_have_text("running")
    await steps.readme(page, "workflow")


# -- 1. the overview's numbers are the seeded ones ------------------------------------------------


async def test_overview_shows_the_seeded_counts(
    dashboard: Dashboard, page: Page, steps: Steps
) -> None:
    """Each count cell of a seeded queue holds exactly the number of its jobs in that state."""
    api, queue = dashboard.api, "b-counts"
    # A different number in each column, so a column showing another's count cannot pass.
    expected = {
        "succeeded": 1,
        "dead": 2,
        "running": 3,
        "pending": 4,
        "cancelled": 5,
        "scheduled": 6,
    }
    (first,) = await enqueue_many(api, queue, 1)
    (held,) = await claim(api, queue)
    assert held["id"] == first["id"]
    await lease_call(api, "complete", "browser-worker", [lease(held)])
    for _ in range(expected["dead"]):
        await run_to_dead(api, queue, [("browser-worker", "boom")])
    for job in await enqueue_many(api, queue, expected["cancelled"]):
        assert (await api.post(f"/v1/jobs/{job['id']}/cancel")).status_code == 200
    await enqueue_many(api, queue, expected["running"])
    assert len(await claim(api, queue, max_jobs=expected["running"])) == expected["running"]
    await enqueue_many(api, queue, expected["pending"])
    await enqueue_many(api, queue, expected["scheduled"], delay_seconds=3600)
    stats = await queue_stats(api, queue)
    assert {c: stats[c] for c in COUNT_COLUMNS} == expected  # the API agrees with the seeding

    await sign_in(page, dashboard.admin_key)
    for column, count in expected.items():
        await expect(queue_cell(page, queue, column)).to_have_text(str(count))
    await expect(queue_cell(page, queue, "oldest")).not_to_be_empty()
    await steps.shot(page, "overview")


# -- 2. keys: a wrong one is refused, a viewer sees no buttons ------------------------------------


async def test_wrong_key_is_refused_and_viewer_sees_no_actions(
    dashboard: Dashboard, page: Page, steps: Steps
) -> None:
    """No session redirects to login; a wrong key shows the error; a viewer gets no action button."""
    dead = await run_to_dead(dashboard.api, "b-viewer", [("browser-worker", "boom")])
    await enqueue_many(dashboard.api, "b-viewer", 2)

    await page.goto("/dashboard")
    await expect(page).to_have_url(re.compile(r"/dashboard/login"))
    await expect(page.locator("form#login-form")).to_be_visible()
    await steps.shot(page, "redirected-to-login")

    wrong = "jobq_1_" + "A" * 43  # shaped like a key, but no such key
    for attempt in (wrong, "not a key"):
        await page.locator("#key").fill(attempt)
        await page.locator("#sign-in").click()
        await expect(page.locator("#login-error")).to_be_visible()
        await expect(page.locator("#login-error")).not_to_be_empty()
        await expect(page).to_have_url(re.compile(r"/dashboard/login"))
        await expect(page.locator("#nav-overview")).to_have_count(0)
    await steps.shot(page, "login-error")

    await sign_in(page, dashboard.viewer_key)
    row = page.locator('table#queues tr[data-queue="b-viewer"]')
    await expect(row.locator('td[data-col="pending"]')).to_have_text("2")
    await expect(page.locator("table#queues button[data-action]")).to_have_count(0)
    await steps.shot(page, "viewer-overview")

    await page.locator("a#nav-jobs").click()
    await expect(page.locator("table#jobs tr[data-job-id]").first).to_be_visible()
    await expect(page.locator("#bulk-retry")).to_have_count(0)
    await expect(page.locator("#bulk-cancel")).to_have_count(0)
    await steps.shot(page, "viewer-jobs")

    await page.goto(f"/dashboard/jobs/{dead['id']}")
    await expect(page.locator("#job-status")).to_have_text("dead")
    await expect(page.locator("#job-retry")).to_have_count(0)
    await expect(page.locator("#job-cancel")).to_have_count(0)
    await steps.shot(page, "viewer-dead-job")

    await page.locator("button#sign-out").click()
    await expect(page).to_have_url(re.compile(r"/dashboard/login"))
    await page.goto("/dashboard")
    await expect(page).to_have_url(re.compile(r"/dashboard/login"))  # the session is gone
    await steps.shot(page, "signed-out")


# -- 3. payload containment ------------------------------------------------------------------------


async def test_filter_by_payload_lists_exactly_the_containing_jobs(
    dashboard: Dashboard, page: Page, steps: Steps
) -> None:
    """``{"user": 42}`` lists the jobs whose payload contains it, in any queue, and no other."""
    api = dashboard.api
    payloads: list[Any] = [
        {"user": 41},
        {"user": 42},
        {"user": 42, "plan": "pro"},  # contains it
        {"user": "42"},  # a string, not the number
        {"profile": {"user": 42}},  # nested deeper: not contained at the top
        {"user": 43},
        [42],
    ]
    jobs = [await enqueue(api, "b-payload", payload=p) for p in payloads]
    other = await enqueue(api, "b-payload-other", payload={"user": 42})
    matching = {jobs[1]["id"], jobs[2]["id"]}

    await sign_in(page, dashboard.admin_key)
    await page.locator("a#nav-jobs").click()
    await filter_jobs(page, payload=json.dumps({"user": 42}))
    await show_jobs(page, matching | {other["id"]})
    await steps.shot(page, "payload-filter")

    await filter_jobs(page, queue="b-payload")
    await show_jobs(page, matching)
    for job_id in matching:
        await expect(page.locator(f'tr[data-job-id="{job_id}"] span.state')).to_have_text("pending")
    await steps.shot(page, "payload-and-queue-filter")

    await filter_jobs(page, payload="{user: 42")
    await expect(page.locator("#filter-error")).to_be_visible()
    await expect(page.locator("#filter-error")).not_to_be_empty()
    await steps.shot(page, "payload-filter-error")


# -- 4. a dead job's errors -------------------------------------------------------------------------


async def test_dead_job_shows_each_error_with_attempt_and_worker(
    dashboard: Dashboard, page: Page, steps: Steps
) -> None:
    """Found through the filters, a dead job's page lists each failure: message, attempt, worker."""
    failures = [
        ("worker-a:101", "SMTP 451 mailbox busy"),
        ("worker-b:202", "SMTP 550 no such user"),
    ]
    dead = await run_to_dead(
        dashboard.api, "b-dead", failures, type="mail", payload={"to": "bob@example.com"}
    )

    await sign_in(page, dashboard.admin_key)
    await page.locator("a#nav-jobs").click()
    await filter_jobs(page, queue="b-dead", state="dead")
    await show_jobs(page, {dead["id"]})
    await steps.shot(page, "dead-listed")
    await page.locator(f'tr[data-job-id="{dead["id"]}"] a.job-link').click()
    await expect(page).to_have_url(re.compile(rf"/dashboard/jobs/{dead['id']}$"))

    await expect(page.locator("#job-status")).to_have_text("dead")
    await expect(page.locator("#job-payload")).to_contain_text("bob@example.com")
    errors = page.locator("ol#job-errors li.job-error")
    await expect(errors).to_have_count(2)
    for attempt, (worker, message) in enumerate(failures, start=1):
        item = errors.filter(has_text=message)
        await expect(item).to_have_count(1)
        await expect(item).to_contain_text(worker)
        await expect(item).to_contain_text(re.compile(rf"attempt\D{{0,3}}{attempt}\b", re.I))
    await steps.shot(page, "dead-job")


# -- 5. retry from the job's page -------------------------------------------------------------------


async def test_retry_makes_a_dead_job_pending(
    dashboard: Dashboard, page: Page, steps: Steps
) -> None:
    """Retry on a dead job's page shows it pending, and the API agrees."""
    dead = await run_to_dead(dashboard.api, "b-retry", [("browser-worker", "boom")])

    await sign_in(page, dashboard.admin_key)
    await page.goto(f"/dashboard/jobs/{dead['id']}")
    await expect(page.locator("#job-status")).to_have_text("dead")
    await steps.shot(page, "dead")
    await page.locator("button#job-retry").click()
    await expect(page.locator("#job-status")).to_have_text("pending")
    await expect(page.locator("#flash")).to_be_visible()
    await expect(page.locator("button#job-retry")).to_have_count(0)  # pending: nothing to retry
    await expect(page.locator("button#job-cancel")).to_be_visible()
    await steps.shot(page, "retried")

    assert (await get_job(dashboard.api, dead["id"]))["status"] == "pending"


# -- 6. pause and resume a queue --------------------------------------------------------------------


async def test_pause_on_the_overview_stops_claims(
    dashboard: Dashboard, page: Page, steps: Steps
) -> None:
    """Paused from the overview, a queue gives no job to a claim; resumed, the claim gets it."""
    api, queue = dashboard.api, "b-pause"
    job = await enqueue(api, queue)

    await sign_in(page, dashboard.admin_key)
    row = page.locator(f'table#queues tr[data-queue="{queue}"]')
    await expect(row.locator("span.paused-badge")).to_have_count(0)
    await steps.shot(page, "running")
    await row.locator('button[data-action="pause"]').click()
    await expect(row.locator("span.paused-badge")).to_be_visible()
    await expect(row.locator('button[data-action="resume"]')).to_be_visible()
    await steps.shot(page, "paused")

    assert (await queue_stats(api, queue))["paused"] is True
    assert await claim(api, queue, wait_seconds=0) == []
    assert (await get_job(api, job["id"]))["status"] == "pending"

    await row.locator('button[data-action="resume"]').click()
    await expect(row.locator("span.paused-badge")).to_have_count(0)
    await expect(row.locator('button[data-action="pause"]')).to_be_visible()
    await steps.shot(page, "resumed")
    assert [j["id"] for j in await claim(api, queue, wait_seconds=0)] == [job["id"]]


# -- 7. bulk cancel ----------------------------------------------------------------------------------


async def test_bulk_cancel_changes_exactly_the_filtered_jobs(
    dashboard: Dashboard, page: Page, steps: Steps
) -> None:
    """Bulk cancel states the count, cancels the filtered jobs and leaves every other one alone."""
    api, queue = dashboard.api, "b-bulk"
    running = await enqueue(api, queue, type="digest")
    (held,) = await claim(api, queue)
    assert held["id"] == running["id"]
    targets = await enqueue_many(api, queue, 4, type="digest")
    bystanders = [
        *await enqueue_many(api, queue, 2, type="receipt"),
        *await enqueue_many(api, "b-bulk-other", 2, type="digest"),
    ]
    target_ids = {j["id"] for j in targets}

    await sign_in(page, dashboard.admin_key)
    await page.locator("a#nav-jobs").click()
    await filter_jobs(page, queue=queue, type="digest", state="pending")
    await show_jobs(page, target_ids)
    await steps.shot(page, "filtered")

    await page.locator("button#bulk-cancel").click()
    await expect(page.locator("#bulk-count")).to_contain_text(number(len(targets)))
    await steps.shot(page, "confirmation")
    await page.locator("button#bulk-confirm").click()
    await expect(page.locator("#flash")).to_contain_text(number(len(targets)))
    await expect(page.locator("#flash")).to_contain_text(re.compile("cancel", re.I))
    await steps.shot(page, "cancelled")

    for job in targets:
        assert (await get_job(api, job["id"]))["status"] == "cancelled", job["id"]
    for job in bystanders:
        assert (await get_job(api, job["id"]))["status"] == "pending", job["id"]
    assert (await get_job(api, running["id"]))["status"] == "running"


# -- 8. auto-refresh, and none while hidden ---------------------------------------------------------

# Headless Chromium keeps every page "visible" (another tab in front, a minimised window and the
# frozen lifecycle state all leave document.visibilityState alone), so the test drives the
# Page Visibility API itself: these getters answer what the test sets, and it fires the event.
VISIBILITY_SWITCH = """
(() => {
  let hidden = false;
  Object.defineProperty(Document.prototype, "hidden", {configurable: true, get: () => hidden});
  Object.defineProperty(Document.prototype, "visibilityState", {
    configurable: true, get: () => (hidden ? "hidden" : "visible"),
  });
  window.__jobqSetHidden = (value) => {
    hidden = value;
    document.dispatchEvent(new Event("visibilitychange"));
  };
})();
"""


async def set_hidden(page: Page, hidden: bool) -> None:
    """Makes the page report itself hidden (or visible again) and tells its scripts."""
    await page.evaluate("hidden => window.__jobqSetHidden(hidden)", hidden)


async def test_overview_refreshes_itself_only_while_visible(
    dashboard: Dashboard, context: BrowserContext, page_log: PageLog, steps: Steps
) -> None:
    """A job enqueued after load shows up without a reload; hidden, the page asks nothing."""
    api, queue = dashboard.api, "b-refresh"
    await context.add_init_script(script=VISIBILITY_SWITCH)
    page = await context.new_page()
    await enqueue(api, queue)
    await sign_in(page, dashboard.admin_key)
    pending = queue_cell(page, queue, "pending")
    await expect(pending).to_have_text("1")
    await page.evaluate("window.__sameDocument = true")  # a reload would drop it
    navigations = sum(1 for r in page_log.requests if r.resource_type == "document")

    await enqueue(api, queue)
    await expect(pending).to_have_text("2", timeout=REFRESH_WITHIN_MS)
    assert await page.evaluate("window.__sameDocument === true"), "the page was reloaded"
    assert sum(1 for r in page_log.requests if r.resource_type == "document") == navigations
    assert page_log.refreshes() > 0
    await steps.shot(page, "refreshed")

    await set_hidden(page, True)
    # A refresh sent just before hiding must not answer with the job enqueued next.
    await poll_until(lambda: page_log.in_flight() == 0, what="requests in flight to finish")
    before = page_log.refreshes()
    await enqueue(api, queue)
    # Watching for something that must not happen takes a window: one and a half intervals,
    # in which a poll every REFRESH_SECONDS would have fired at least once.
    await asyncio.sleep(1.5 * REFRESH_SECONDS)
    assert page_log.refreshes() == before, "the hidden page kept refreshing"
    await expect(pending).to_have_text("2")
    await steps.shot(page, "hidden-no-refresh")

    await set_hidden(page, False)
    await expect(pending).to_have_text("3", timeout=REFRESH_WITHIN_MS)
    assert page_log.refreshes() > before
    await steps.shot(page, "visible-again")


# -- 9. nothing from elsewhere ---------------------------------------------------------------------


async def test_pages_load_nothing_from_another_origin(
    dashboard: Dashboard, page: Page, page_log: PageLog, steps: Steps
) -> None:
    """Every request of every page (scripts, styles, fonts, images, htmx) goes to the server."""
    dead = await run_to_dead(dashboard.api, "b-origin", [("browser-worker", "boom")])
    await sign_in(page, dashboard.admin_key)
    await page.wait_for_load_state("networkidle")
    await steps.shot(page, "overview")
    for name, path in (
        ("jobs", "/dashboard/jobs"),
        ("workers", "/dashboard/workers"),
        ("audit", "/dashboard/audit"),
        ("overview", "/dashboard"),
    ):
        await page.locator(f"a#nav-{name}").click()
        await expect(page).to_have_url(re.compile(rf"{re.escape(path)}(\?.*)?$"))
        await page.wait_for_load_state("networkidle")
        await steps.shot(page, name)
    await page.goto(f"/dashboard/jobs/{dead['id']}")
    await page.wait_for_load_state("networkidle")
    await steps.shot(page, "job")

    origin = urlsplit(dashboard.url)
    urls = page_log.urls()
    kinds = {r.resource_type for r in page_log.requests}
    assert {"document", "script", "stylesheet"} <= kinds, kinds  # the assets were all seen
    elsewhere = [
        u
        for u in urls
        if (urlsplit(u).scheme, urlsplit(u).netloc) != (origin.scheme, origin.netloc)
    ]
    assert elsewhere == [], f"requests off {dashboard.url}: {elsewhere}"
    # A load the Content-Security-Policy refused is never sent, so it is not among the requests:
    # the browser reports it on the console instead (as it does a missing asset). The browser's
    # own guess at /favicon.ico (the pages name no icon) is no asset of theirs.
    refused = [e for e in page_log.console_errors if not e.endswith("/favicon.ico)")]
    assert refused == [], f"loads refused or missing: {refused}"
