"""Each page renders real jobs in every state; filters, paging, bulk actions and bad input."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator

import httpx
import pytest
from fastapi import FastAPI

from app.api.state import app_state
from tests.api.dashboard import DashboardKeys, Seeded, api, csrf_of, job_status, signed_in

STATES = ("scheduled", "pending", "running", "succeeded", "dead", "cancelled")


def job_ids(html: str) -> list[int]:
    return [int(i) for i in re.findall(r'<tr data-job-id="(\d+)"', html)]


def cell(html: str, queue: str, column: str) -> str:
    row = html.split(f'<tr data-queue="{queue}"', 1)[1].split("</tr>", 1)[0]
    found = re.search(rf'<td[^>]*data-col="{column}">(.*?)</td>', row)
    assert found is not None, row
    return re.sub(r"<[^>]+>", "", found.group(1))


@pytest.fixture
async def admin(app: FastAPI, dashboard_keys: DashboardKeys) -> AsyncIterator[httpx.AsyncClient]:
    """A browser signed in with the admin key."""
    async with signed_in(app, dashboard_keys.admin) as client:
        yield client


async def test_the_overview_counts_each_queue_and_charts_the_last_hour(
    admin: httpx.AsyncClient, seeded: Seeded
) -> None:
    page = await admin.get("/dashboard")
    assert page.status_code == 200
    html = page.text
    assert '<table id="queues"' in html
    assert [cell(html, "emails", s) for s in STATES] == ["0", "2", "0", "0", "0", "1"]
    assert cell(html, "long", "running") == "1"
    assert cell(html, "fast", "succeeded") == "1"
    assert cell(html, "flaky", "dead") == "1"
    assert cell(html, "later", "scheduled") == "1"
    assert re.fullmatch(r"\d+ s", cell(html, "emails", "oldest"))
    assert cell(html, "later", "oldest") == "—"
    assert '<svg id="throughput"' in html
    # One success, a failed attempt (retried) and a job gone dead this minute: side by side.
    assert "1 succeeded, 1 failed attempt, 1 dead" in html
    assert html.count('class="ok"') == 1 and html.count('class="failed"') == 1
    assert html.count('class="dead"') == 1
    fragment = await admin.get("/dashboard/fragments/overview", headers={"HX-Request": "true"})
    assert fragment.text.lstrip().startswith('<section id="overview-live"')
    assert "<html" not in fragment.text


async def test_pause_and_resume_from_the_overview(admin: httpx.AsyncClient, seeded: Seeded) -> None:
    page = await admin.get("/dashboard")
    paused = await admin.post("/dashboard/queues/emails/pause", data={"csrf": csrf_of(page.text)})
    assert paused.status_code == 303 and paused.headers["location"] == "/dashboard"
    html = (await admin.get("/dashboard")).text
    assert '<div id="flash" class="flash flash-ok" role="status">Paused queue emails</div>' in html
    row = html.split('<tr data-queue="emails"', 1)[1].split("</tr>", 1)[0]
    assert '<span class="paused-badge">paused</span>' in row
    assert 'data-action="resume"' in row and 'data-action="pause"' not in row
    await admin.post("/dashboard/queues/emails/resume", data={"csrf": csrf_of(html)})
    row = (await admin.get("/dashboard")).text.split('<tr data-queue="emails"', 1)[1]
    assert "paused-badge" not in row.split("</tr>", 1)[0]
    bad = await admin.post("/dashboard/queues/-nope/pause", data={"csrf": csrf_of(html)})
    assert bad.status_code == 400


async def test_the_jobs_page_lists_every_state_and_filters(
    admin: httpx.AsyncClient, seeded: Seeded
) -> None:
    page = await admin.get("/dashboard/jobs")
    assert page.status_code == 200
    listed = job_ids(page.text)
    assert listed == sorted(listed, reverse=True)  # newest first
    assert set(listed) == {
        seeded.pending,
        seeded.scheduled,
        seeded.running,
        seeded.succeeded,
        seeded.dead,
        seeded.cancelled,
        seeded.hostile,
    }
    for state in STATES:
        job = getattr(seeded, state)
        row = page.text.split(f'<tr data-job-id="{job}"', 1)[1].split("</tr>", 1)[0]
        assert f'<a class="job-link" href="/dashboard/jobs/{job}">' in row
        assert f'<span class="state state-{state}">{state}</span>' in row
    # Counts come from the queues' counters.
    assert '<span data-total="pending">2</span>' in page.text
    filters = {
        "state=dead": [seeded.dead],
        "queue=emails": [seeded.cancelled, seeded.hostile, seeded.pending],
        "queue=emails&state=pending": [seeded.hostile, seeded.pending],
        "type=welcome": [seeded.cancelled, seeded.pending],
        "payload=%7B%22user%22%3A+42%7D": [seeded.pending],
        "payload=%7B%22user%22%3A42%7D&state=cancelled": [],
        "payload=%5B%5D&queue=emails": [],  # any JSON the API takes: an array contains nothing here
        "queue=nowhere": [],
    }
    for query, expected in filters.items():
        answer = await admin.get(f"/dashboard/jobs?{query}")
        assert answer.status_code == 200, query
        assert job_ids(answer.text) == expected, query
    # Creation times, read in UTC as the form's datetime-local fields give them.
    past, future = "2000-01-01T00%3A00", "2999-01-01T00%3A00"
    assert job_ids((await admin.get(f"/dashboard/jobs?created_before={past}")).text) == []
    recent = await admin.get(f"/dashboard/jobs?created_after={past}&created_before={future}")
    assert job_ids(recent.text) == listed
    assert 'name="created_after" type="datetime-local" value="2000-01-01T00:00"' in recent.text
    emails = (await admin.get("/dashboard/jobs?queue=emails")).text
    assert 'name="queue" value="emails"' in emails
    assert "Queue emails holds" in emails and '<span data-total="cancelled">1</span>' in emails


UNUSABLE_FILTERS = [
    ("payload=%7Buser%3A+42%7D", "invalid JSON"),
    ("payload=%7B%22a%22%3A+1%2C+%22a%22%3A+2%7D", "duplicate key"),
    ("payload=null", "must be a JSON object or array"),
    ("payload=42", "must be a JSON object or array"),
    ("payload=%22x%22", "must be a JSON object or array"),
    ("payload=true", "must be a JSON object or array"),
    ("payload=%7B%22a%22%3A+NaN%7D", "NaN is not valid JSON"),
    ("payload=%7B%22a%22%3A+1e999%7D", "too large"),
    ("payload=%7B%22a%22%3A+%22%5Cu0000%22%7D", "NUL"),
    ("payload=" + "%7B%22a%22%3A" * 1500 + "1" + "%7D" * 1500, "at most 4096 characters"),
    ("payload=" + "%5B" * 1900 + "%5D" * 1900, "nested too deeply"),
    ("state=sleeping", "Unknown state"),
    ("queue=%2Fetc", "queue name"),
    ("queue=" + "q" * 300, "queue name"),
    ("type=a%00b", "job type"),
    ("after=%21%21%21", "page position"),
    ("after=" + "x" * 300, "page position"),
    ("created_after=yesterday", "not a date and time"),
    ("created_before=9999-12-31T23%3A59", "out of range"),
]


async def test_unusable_filters_show_an_inline_error_with_400(
    admin: httpx.AsyncClient, seeded: Seeded
) -> None:
    for query, message in UNUSABLE_FILTERS:
        answer = await admin.get(f"/dashboard/jobs?{query}")
        assert answer.status_code == 400, (query[:60], answer.text[-500:])
        assert '<div id="filter-error"' in answer.text
        assert message in answer.text.split('id="filter-error"', 1)[1], query[:60]
        assert '<form id="job-filters"' in answer.text  # the form stays, to correct the value
        fragment = await admin.get(
            f"/dashboard/fragments/jobs?{query}", headers={"HX-Request": "true"}
        )
        assert fragment.status_code == 400 and message in fragment.text, query[:60]


async def test_keyset_paging_with_older_links(
    app: FastAPI, dashboard_keys: DashboardKeys, admin: httpx.AsyncClient
) -> None:
    async with api(app, dashboard_keys.admin) as client:
        made = await client.post(
            "/v1/jobs/batch", json={"jobs": [{"queue": "bulk", "type": "n"} for _ in range(73)]}
        )
        ids = sorted((j["id"] for j in made.json()["jobs"]), reverse=True)
    first = await admin.get("/dashboard/jobs?queue=bulk")
    assert job_ids(first.text) == ids[:50]
    older = re.search(r'<a id="next-page" href="([^"]+)">Older →</a>', first.text)
    assert older is not None
    href = older.group(1).replace("&amp;", "&")
    assert "queue=bulk" in href and "after=" in href and "offset" not in href
    second = await admin.get(href)
    assert job_ids(second.text) == ids[50:]
    assert 'id="next-page"' not in second.text
    assert 'id="first-page"' in second.text


async def test_bulk_actions_confirm_the_exact_count_then_report_what_changed(
    app: FastAPI, admin: httpx.AsyncClient, seeded: Seeded
) -> None:
    jobs = await admin.get("/dashboard/jobs?queue=emails")
    assert 'id="bulk-cancel"' in jobs.text
    confirm = await admin.get("/dashboard/jobs/bulk?action=cancel&queue=emails")
    assert confirm.status_code == 200
    count = confirm.text.split('id="bulk-count"', 1)[1].split("</p>", 1)[0]
    assert "<strong>2</strong> jobs" in count
    assert 'id="bulk-confirm"' in confirm.text
    # Nothing changed yet.
    assert str(await job_status(app, seeded.pending)) == "pending"
    form = dict(re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)">', confirm.text))
    assert form["action"] == "cancel" and form["queue"] == "emails"
    done = await admin.post("/dashboard/jobs/bulk", data=form)
    assert done.status_code == 303 and done.headers["location"] == "/dashboard/jobs?queue=emails"
    after = await admin.get(done.headers["location"])
    assert (
        '<div id="flash" class="flash flash-ok" role="status">Cancelled 2 jobs</div>' in after.text
    )
    assert str(await job_status(app, seeded.pending)) == "cancelled"
    assert str(await job_status(app, seeded.hostile)) == "cancelled"

    retry = await admin.get("/dashboard/jobs/bulk?action=retry&state=cancelled&queue=emails")
    assert "<strong>3</strong> jobs" in retry.text
    form = dict(re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)">', retry.text))
    done = await admin.post("/dashboard/jobs/bulk", data=form)
    landed = await admin.get(done.headers["location"])
    assert "Retried 3 jobs" in landed.text
    entries, _ = (
        await app_state(app)
        .running()
        .services.ops.audit_list(action=None, actor="admin", limit=10, after=None)
    )
    assert len([e for e in entries if "bulk" in e.action]) == 2
    audit = await admin.get("/dashboard/audit")
    assert "bulk" in audit.text

    nothing = await admin.get("/dashboard/jobs/bulk?action=retry&queue=nowhere")
    assert "<strong>0</strong> jobs" in nothing.text and 'id="bulk-confirm"' not in nothing.text
    wrong_state = await admin.get("/dashboard/jobs/bulk?action=cancel&state=running")
    assert wrong_state.status_code == 400
    running = await admin.get("/dashboard/jobs?state=running")
    assert 'id="bulk-cancel"' not in running.text and 'id="bulk-retry"' not in running.text
    assert (await admin.get("/dashboard/jobs/bulk?action=delete")).status_code == 400
    assert (await admin.get("/dashboard/jobs/bulk?action=retry&payload=%5B")).status_code == 400


async def test_a_running_job_shows_progress_checkpoint_lease_and_timeline(
    admin: httpx.AsyncClient, seeded: Seeded
) -> None:
    page = await admin.get(f"/dashboard/jobs/{seeded.running}")
    assert page.status_code == 200
    html = page.text
    assert '<span class="state state-running" id="job-status">running</span>' in html
    assert re.search(r'<progress id="job-progress" value="8(\.0)?" max="20(\.0)?">', html)
    assert 'id="job-checkpoint">{\n  &#34;last_id&#34;: 800\n}</pre>' in html
    assert '<code id="lease-worker">host-a:1</code>' in html
    assert '<dd id="lease-key">admin</dd>' in html
    expiry = re.search(
        r'<time class="countdown" id="lease-expiry" datetime="[^"]+" data-expires-at="([^"]+)"',
        html,
    )
    assert expiry is not None and expiry.group(1).endswith("Z")
    assert 'id="job-cancel"' in html and 'id="job-retry"' not in html
    assert 'id="job-payload">{\n  &#34;rows&#34;: 20\n}</pre>' in html
    timeline = html.split('id="job-timeline"', 1)[1]
    assert "enqueued in" in timeline and "attempt 1 claimed by host-a:1" in timeline
    fragment = await admin.get(
        f"/dashboard/fragments/jobs/{seeded.running}", headers={"HX-Request": "true"}
    )
    assert fragment.status_code == 200 and 'id="lease-expiry"' in fragment.text


async def test_a_dead_job_lists_each_error_with_its_attempt_and_worker(
    admin: httpx.AsyncClient, seeded: Seeded
) -> None:
    html = (await admin.get(f"/dashboard/jobs/{seeded.dead}")).text
    errors = html.split('<ol id="job-errors"', 1)[1].split("</ol>", 1)[0]
    items = errors.split('<li class="job-error">')[1:]
    assert len(items) == 2
    # Newest first: the error that killed the job leads.
    for attempt, item in zip((2, 1), items, strict=True):
        assert f'<span class="attempt">attempt {attempt}</span>' in item
        assert "host-&lt;script&gt;" in item
        assert f"attempt {attempt} broke:" in item
    assert 'id="job-retry"' in html and 'id="job-cancel"' not in html
    assert 'id="lease-expiry"' not in html
    timeline = html.split('id="job-timeline"', 1)[1]
    assert "attempt 1 failed" in timeline
    assert re.search(
        r'<li class="tl-dead">[^<]*<time[^>]*>[^<]*</time> <span class="what">attempt 2 failed: [^<]*dead: no attempts left',
        timeline,
    )


async def test_each_state_has_a_job_page(admin: httpx.AsyncClient, seeded: Seeded) -> None:
    for state in STATES:
        answer = await admin.get(f"/dashboard/jobs/{getattr(seeded, state)}")
        assert answer.status_code == 200, state
        assert f'id="job-status">{state}</span>' in answer.text
        for part in (
            'id="job-payload"',
            'id="job-result"',
            'id="job-errors"',
            'id="job-checkpoint"',
        ):
            assert part in answer.text, (state, part)
        if state == "succeeded":
            assert 'id="job-result">{\n  &#34;echo&#34;' in answer.text


async def test_job_actions_report_their_outcome(
    app: FastAPI, admin: httpx.AsyncClient, seeded: Seeded
) -> None:
    page = await admin.get(f"/dashboard/jobs/{seeded.running}")
    cancelled = await admin.post(
        f"/dashboard/jobs/{seeded.running}/cancel", data={"csrf": csrf_of(page.text)}
    )
    assert cancelled.headers["location"] == f"/dashboard/jobs/{seeded.running}"
    html = (await admin.get(cancelled.headers["location"])).text
    assert (
        f'id="flash" class="flash flash-ok" role="status">Cancelled job {seeded.running}</div>'
        in html
    )
    assert 'id="job-status">cancelled</span>' in html
    # Retrying a pending job is refused by the service; the page says why.
    refused = await admin.post(
        f"/dashboard/jobs/{seeded.pending}/retry", data={"csrf": csrf_of(html)}
    )
    message = (await admin.get(refused.headers["location"])).text
    assert 'class="flash flash-error"' in message and "pending" in message
    assert str(await job_status(app, seeded.pending)) == "pending"


async def test_unknown_jobs_are_404_pages(admin: httpx.AsyncClient, seeded: Seeded) -> None:
    token = csrf_of((await admin.get("/dashboard")).text)
    for job in ("999999", "0", "abc", "-1", "1e3", "99999999999999999999", "%E2%91%A0"):
        answer = await admin.get(f"/dashboard/jobs/{job}")
        assert answer.status_code == 404, job
        assert answer.headers["content-type"].startswith("text/html")
        assert "not found" in answer.text.lower()
        fragment = await admin.get(
            f"/dashboard/fragments/jobs/{job}", headers={"HX-Request": "true"}
        )
        assert fragment.status_code == 404, job
        posted = await admin.post(f"/dashboard/jobs/{job}/cancel", data={"csrf": token})
        assert posted.status_code == 404, job


async def test_other_dashboard_paths(admin: httpx.AsyncClient) -> None:
    assert (await admin.get("/dashboard/nowhere")).status_code == 404
    assert "no such dashboard page" in (await admin.get("/dashboard/a/b/c")).text
    slash = await admin.get("/dashboard/")
    assert slash.status_code == 307 and slash.headers["location"] == "/dashboard"
    multipart = await admin.post("/dashboard/queues/emails/pause", files={"csrf": ("a", b"b")})
    assert multipart.status_code == 415


async def test_the_workers_page_shows_who_holds_what(
    admin: httpx.AsyncClient, seeded: Seeded
) -> None:
    html = (await admin.get("/dashboard/workers")).text
    row = html.split('<tr data-worker-id="host-a:1"', 1)[1].split("</tr>", 1)[0]
    assert "<td>admin</td>" in row  # the key it claimed with
    assert re.search(
        rf'<a class="job-link" href="/dashboard/jobs/{seeded.running}"[^>]*>#{seeded.running}</a>',
        row,
    )
    assert 'class="running-for"' in row  # how long the held job has been running
    assert 'data-state="busy"' in html.split('<tr data-worker-id="host-a:1"', 1)[1][:40]
    assert 'class="countdown"' in row and "data-expires-at=" in row
    instance = re.findall(r"<td>([^<]*)</td>", row)[1]
    assert instance and instance != "—"  # the instance that granted the lease


async def test_the_audit_page_lists_actions_newest_first_and_filters(
    app: FastAPI, admin: httpx.AsyncClient, seeded: Seeded
) -> None:
    token = csrf_of((await admin.get("/dashboard")).text)
    await admin.post("/dashboard/queues/emails/pause", data={"csrf": token})
    await admin.post("/dashboard/queues/emails/resume", data={"csrf": token})
    html = (await admin.get("/dashboard/audit")).text
    actions = re.findall(r"<td><code>([a-z_.]+)</code></td>", html)
    assert actions[:3] == ["queue.resume", "queue.pause", "job.cancel"]
    only = (await admin.get("/dashboard/audit?action=queue.pause")).text
    assert re.findall(r"<td><code>([a-z_.]+)</code></td>", only) == ["queue.pause"]
    assert (await admin.get("/dashboard/audit?after=%21%21")).status_code == 400
    assert (await admin.get("/dashboard/audit?action=DROP+TABLE")).status_code == 400
    nobody = (await admin.get("/dashboard/audit?actor=nobody")).text
    assert "Nothing recorded" in nobody


async def test_a_job_page_shows_its_concurrency_key_escaped(
    app: FastAPI, dashboard_keys: DashboardKeys, admin: httpx.AsyncClient
) -> None:
    async with api(app, dashboard_keys.admin) as client:
        r = await client.post(
            "/v1/jobs", json={"type": "t", "concurrency_key": "customer:<b>42</b>"}
        )
        assert r.status_code == 201, r.text
    html = (await admin.get(f"/dashboard/jobs/{r.json()['id']}")).text
    assert "<code>customer:&lt;b&gt;42&lt;/b&gt;</code>" in html
