"""Who may see and do what: every page, fragment and action with no session, as viewer, as admin,
with keys that may not sign in, with scoped keys, and with authentication off."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
from fastapi import FastAPI

from app.api.state import app_state
from tests.api.dashboard import (
    DashboardKeys,
    Seeded,
    api,
    browser,
    csrf_of,
    job_status,
    page_token,
    seed_jobs,
    sign_in,
    signed_in,
)

PAGES = (
    "/dashboard",
    "/dashboard/jobs",
    "/dashboard/jobs/{dead}",
    "/dashboard/workers",
    "/dashboard/audit",
)
FRAGMENTS = (
    "/dashboard/fragments/overview",
    "/dashboard/fragments/jobs",
    "/dashboard/fragments/jobs/{dead}",
    "/dashboard/fragments/workers",
    "/dashboard/fragments/audit",
)
ADMIN_PAGES = ("/dashboard/jobs/bulk?action=cancel&queue=emails",)
HTMX = {"HX-Request": "true", "HX-Current-URL": "http://jobq.test/dashboard/workers"}


def paths(templates: tuple[str, ...], seeded: Seeded) -> list[str]:
    return [t.format(dead=seeded.dead) for t in templates]


async def queue_paused(app: FastAPI, name: str) -> bool:
    rows = await app_state(app).running().services.ops.queue_stats()
    return any(r.name == name and r.paused for r in rows)


@dataclass(frozen=True)
class Action:
    """An admin action: where it posts, what it sends, and whether it took effect."""

    name: str
    path: str
    fields: dict[str, str]
    done: Callable[[FastAPI, Seeded], Awaitable[bool]]


async def _paused(app: FastAPI, _: Seeded) -> bool:
    return await queue_paused(app, "emails")


async def _cancelled(app: FastAPI, seeded: Seeded) -> bool:
    return str(await job_status(app, seeded.pending)) == "cancelled"


async def _retried(app: FastAPI, seeded: Seeded) -> bool:
    return str(await job_status(app, seeded.dead)) == "pending"


async def _bulk_cancelled(app: FastAPI, seeded: Seeded) -> bool:
    return str(await job_status(app, seeded.hostile)) == "cancelled"


def actions(seeded: Seeded) -> list[Action]:
    return [
        Action("pause", "/dashboard/queues/emails/pause", {}, _paused),
        Action("cancel", f"/dashboard/jobs/{seeded.pending}/cancel", {}, _cancelled),
        Action("retry", f"/dashboard/jobs/{seeded.dead}/retry", {}, _retried),
        Action(
            "bulk cancel",
            "/dashboard/jobs/bulk",
            {"action": "cancel", "queue": "emails", "state": "pending"},
            _bulk_cancelled,
        ),
    ]


async def test_pages_without_a_session_redirect_to_the_sign_in_form(
    app: FastAPI, dashboard_keys: DashboardKeys, seeded: Seeded, anonymous: httpx.AsyncClient
) -> None:
    for path in [*paths(PAGES, seeded), *ADMIN_PAGES]:
        answer = await anonymous.get(path)
        assert answer.status_code == 303, path
        target = urlsplit(answer.headers["location"])
        assert target.path == "/dashboard/login", path
        assert parse_qs(target.query)["next"] == [path], path
        assert "content-security-policy" in answer.headers


async def test_fragments_without_a_session_answer_401_with_hx_redirect(
    app: FastAPI, dashboard_keys: DashboardKeys, seeded: Seeded, anonymous: httpx.AsyncClient
) -> None:
    for path in paths(FRAGMENTS, seeded):
        answer = await anonymous.get(path, headers=HTMX)
        assert answer.status_code == 401, path
        assert answer.headers["hx-redirect"] == "/dashboard/login?next=%2Fdashboard%2Fworkers"


async def test_actions_without_a_session_change_nothing(
    app: FastAPI, dashboard_keys: DashboardKeys, seeded: Seeded, anonymous: httpx.AsyncClient
) -> None:
    for action in actions(seeded):
        answer = await anonymous.post(action.path, data={**action.fields, "csrf": "0" * 64})
        assert answer.status_code == 303, action.name
        assert answer.headers["location"] == "/dashboard/login", action.name
        assert not await action.done(app, seeded), action.name


async def test_a_viewer_sees_every_page_without_action_buttons_and_may_not_act(
    app: FastAPI, dashboard_keys: DashboardKeys, seeded: Seeded
) -> None:
    async with signed_in(app, dashboard_keys.viewer) as viewer:
        for path in paths(PAGES, seeded):
            answer = await viewer.get(path)
            assert answer.status_code == 200, path
            for button in (
                'data-action="pause"',
                'id="job-retry"',
                'id="bulk-retry"',
                'id="bulk-cancel"',
            ):
                assert button not in answer.text, (path, button)
            assert 'id="sign-out"' in answer.text
        for path in paths(FRAGMENTS, seeded):
            assert (await viewer.get(path, headers=HTMX)).status_code == 200, path
        for path in ADMIN_PAGES:
            refused = await viewer.get(path)
            assert refused.status_code == 403, path
            assert "admin" in refused.text
        token = await page_token(viewer)
        for action in actions(seeded):
            answer = await viewer.post(action.path, data={**action.fields, "csrf": token})
            assert answer.status_code == 403, action.name
            assert "role viewer" in answer.text
            assert not await action.done(app, seeded), action.name


@pytest.mark.parametrize("index", range(4), ids=["pause", "cancel", "retry", "bulk-cancel"])
async def test_an_admin_sees_the_buttons_and_each_action_works(
    app: FastAPI, dashboard_keys: DashboardKeys, seeded: Seeded, index: int
) -> None:
    action = actions(seeded)[index]
    async with signed_in(app, dashboard_keys.admin) as admin:
        overview = await admin.get("/dashboard")
        assert 'data-action="pause"' in overview.text
        dead = await admin.get(f"/dashboard/jobs/{seeded.dead}")
        assert 'id="job-retry"' in dead.text
        jobs = await admin.get("/dashboard/jobs")
        assert 'id="bulk-retry"' in jobs.text and 'id="bulk-cancel"' in jobs.text
        for path in ADMIN_PAGES:
            assert (await admin.get(path)).status_code == 200, path
        answer = await admin.post(action.path, data={**action.fields, "csrf": csrf_of(jobs.text)})
        assert answer.status_code == 303, answer.text
        assert await action.done(app, seeded)
        landed = await admin.get(answer.headers["location"])
        assert landed.status_code == 200
        assert 'id="flash"' in landed.text
        # Shown once: the next page has no flash.
        assert 'id="flash"' not in (await admin.get(answer.headers["location"])).text


@pytest.mark.parametrize("role", ["worker", "producer"])
async def test_a_worker_or_producer_key_cannot_sign_in(
    app: FastAPI, dashboard_keys: DashboardKeys, role: str
) -> None:
    async with browser(app) as client:
        answer = await sign_in(client, getattr(dashboard_keys, role))
        assert answer.status_code == 403
        assert 'id="login-error"' in answer.text
        assert f"role {role}" in answer.text and "viewer or admin key" in answer.text
        assert "jobq_session" not in answer.headers.get("set-cookie", "")
        assert (await client.get("/dashboard")).status_code == 303


async def test_a_session_cookie_holding_a_worker_key_sees_no_page(
    app: FastAPI, dashboard_keys: DashboardKeys, seeded: Seeded
) -> None:
    async with browser(app) as client:
        client.cookies.set(
            "jobq_session", dashboard_keys.worker, domain="jobq.test", path="/dashboard"
        )
        for path in paths(PAGES, seeded):
            answer = await client.get(path)
            assert answer.status_code == 403, path
            assert "role worker" in answer.text and "viewer or admin key" in answer.text


async def test_a_wrong_key_is_refused_with_a_message_and_counts_as_a_failed_authentication(
    app: FastAPI, dashboard_keys: DashboardKeys
) -> None:
    async with browser(app) as client:
        for secret in ("jobq_1_" + "A" * 43, "not a key", dashboard_keys.viewer + "x"):
            answer = await sign_in(client, secret)
            assert answer.status_code == 401
            assert 'id="login-error"' in answer.text and "not valid" in answer.text
            assert secret not in answer.text  # a wrong key is never echoed back
        empty = await sign_in(client, "   ")
        assert empty.status_code == 400 and 'id="login-error"' in empty.text


async def test_sign_in_failures_share_the_apis_limiter(
    app: FastAPI, dashboard_keys: DashboardKeys
) -> None:
    budget = app_state(app).settings.auth_failures_per_minute
    async with browser(app) as client:
        form = await client.get("/dashboard/login")
        token = csrf_of(form.text)
        for _ in range(budget):
            wrong = await client.post(
                "/dashboard/login", data={"key": "jobq_1_" + "B" * 43, "csrf": token}
            )
            assert wrong.status_code == 401
        limited = await client.post(
            "/dashboard/login", data={"key": "jobq_1_" + "B" * 43, "csrf": token}
        )
        assert limited.status_code == 429
        assert "Too many failed sign-ins" in limited.text
        assert int(limited.headers["retry-after"]) >= 1
        # As on the API, a valid key is answered from memory and never limited.
        valid = await client.post(
            "/dashboard/login", data={"key": dashboard_keys.viewer, "csrf": token}
        )
        assert valid.status_code == 303
    # The bearer API counts the same failures for the same address.
    async with api(app, "jobq_1_" + "C" * 43) as client:
        assert (await client.get("/v1/queues")).status_code == 429


async def test_the_sign_in_form_needs_its_own_csrf_token(
    app: FastAPI, dashboard_keys: DashboardKeys
) -> None:
    async with browser(app) as client:
        await client.get("/dashboard/login")
        answer = await client.post("/dashboard/login", data={"key": dashboard_keys.admin})
        assert answer.status_code == 403 and 'id="login-error"' in answer.text
        forged = await client.post(
            "/dashboard/login", data={"key": dashboard_keys.admin, "csrf": "ab" * 32}
        )
        assert forged.status_code == 403
        assert (await client.get("/dashboard")).status_code == 303


async def test_sign_in_returns_to_the_page_asked_for_and_never_leaves_the_dashboard(
    app: FastAPI, dashboard_keys: DashboardKeys
) -> None:
    async with browser(app) as client:
        form = await client.get("/dashboard/login?next=/dashboard/workers")
        assert 'name="next" value="/dashboard/workers"' in form.text
        answer = await client.post(
            "/dashboard/login",
            data={
                "key": dashboard_keys.viewer,
                "csrf": csrf_of(form.text),
                "next": "/dashboard/workers",
            },
        )
        assert answer.headers["location"] == "/dashboard/workers"
    for hostile in (
        "https://evil.example/",
        "//evil.example/dashboard",
        "/v1/jobs",
        "/dashboard\\@evil",
    ):
        async with browser(app) as client:
            form = await client.get("/dashboard/login", params={"next": hostile})
            answer = await client.post(
                "/dashboard/login",
                data={"key": dashboard_keys.viewer, "csrf": csrf_of(form.text), "next": hostile},
            )
            assert answer.headers["location"] == "/dashboard", hostile


async def test_with_authentication_off_the_sign_in_form_sends_people_to_the_overview(
    app: FastAPI, anonymous: httpx.AsyncClient
) -> None:
    # No key exists yet: authentication is off, the form sends people to the overview.
    answer = await anonymous.get("/dashboard/login")
    assert answer.status_code == 303 and answer.headers["location"] == "/dashboard"


async def test_with_authentication_off_every_page_is_open_and_actions_still_need_the_token(
    app: FastAPI, anonymous: httpx.AsyncClient
) -> None:
    async with api(app) as client:
        seeded = await seed_jobs(client)
    for path in [*paths(PAGES, seeded), *ADMIN_PAGES]:
        answer = await anonymous.get(path)
        assert answer.status_code == 200, path
        assert "authentication off" in answer.text
        assert 'id="sign-out"' not in answer.text
    for path in paths(FRAGMENTS, seeded):
        assert (await anonymous.get(path, headers=HTMX)).status_code == 200, path
    token = await page_token(anonymous)
    for action in actions(seeded):
        refused = await anonymous.post(action.path, data=action.fields)
        assert refused.status_code == 403, action.name
        assert not await action.done(app, seeded), action.name
        answer = await anonymous.post(action.path, data={**action.fields, "csrf": token})
        assert answer.status_code == 303, (action.name, answer.text)
        assert await action.done(app, seeded), action.name
    # Another browser (no nonce cookie of its own) cannot use the first one's token.
    async with browser(app) as other:
        stolen = await other.post("/dashboard/queues/emails/resume", data={"csrf": token})
        assert stolen.status_code == 403
    audit = (
        await app_state(app)
        .running()
        .services.ops.audit_list(action=None, actor="anonymous", limit=50, after=None)
    )
    assert {row.action for row in audit[0]} >= {"queue.pause", "job.cancel", "job.retry"}


async def test_a_scoped_key_sees_and_acts_on_its_queues_only(
    app: FastAPI, dashboard_keys: DashboardKeys, seeded: Seeded
) -> None:
    async with api(app, dashboard_keys.admin) as client:
        billing: dict[str, Any] = (
            await client.post("/v1/jobs", json={"queue": "billing.eu", "type": "invoice"})
        ).json()
    async with signed_in(app, dashboard_keys.scoped_viewer) as viewer:
        overview = await viewer.get("/dashboard")
        assert 'data-queue="billing.eu"' in overview.text
        assert 'data-queue="emails"' not in overview.text
        jobs = await viewer.get("/dashboard/jobs")
        assert f'data-job-id="{billing["id"]}"' in jobs.text
        assert f'data-job-id="{seeded.pending}"' not in jobs.text
        assert (await viewer.get("/dashboard/jobs?queue=emails")).status_code == 403
        assert (await viewer.get(f"/dashboard/jobs/{seeded.pending}")).status_code == 403
        assert (await viewer.get(f"/dashboard/jobs/{billing['id']}")).status_code == 200
        workers = await viewer.get("/dashboard/workers")
        assert "host-a:1" not in workers.text
    async with signed_in(app, dashboard_keys.scoped_admin) as admin:
        token = await page_token(admin)
        refused = await admin.post("/dashboard/queues/emails/pause", data={"csrf": token})
        assert refused.status_code == 403
        assert not await queue_paused(app, "emails")
        cancel = await admin.post(f"/dashboard/jobs/{seeded.pending}/cancel", data={"csrf": token})
        assert cancel.status_code == 403
        assert str(await job_status(app, seeded.pending)) == "pending"
        bulk = await admin.post(
            "/dashboard/jobs/bulk", data={"csrf": token, "action": "cancel", "queue": "emails"}
        )
        assert bulk.status_code == 403
        # Without a queue, a bulk action covers the key's queues only.
        confirm = await admin.get("/dashboard/jobs/bulk?action=cancel")
        assert "<strong>1</strong> job" in confirm.text
        assert (
            await admin.post("/dashboard/queues/billing.eu/pause", data={"csrf": token})
        ).status_code == 303
        assert await queue_paused(app, "billing.eu")
