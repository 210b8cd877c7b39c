"""The session cookie's attributes, sign-out, revocation, and CSRF tokens on every action."""

from __future__ import annotations

import hashlib
import hmac

import httpx
from fastapi import FastAPI
from sqlalchemy.ext.asyncio import AsyncEngine

from app.api.state import app_state
from app.auth import store
from tests.api.dashboard import (
    DashboardKeys,
    Seeded,
    api,
    browser,
    csrf_of,
    job_status,
    page_token,
    sign_in,
    signed_in,
)


def session_cookie(answer: httpx.Response) -> str:
    [cookie] = [c for c in answer.headers.get_list("set-cookie") if c.startswith("jobq_session=")]
    return cookie


async def test_the_session_cookie_is_httponly_strict_and_limited_to_the_dashboard(
    app: FastAPI, dashboard_keys: DashboardKeys
) -> None:
    async with browser(app) as client:
        answer = await sign_in(client, dashboard_keys.viewer)
        assert answer.status_code == 303 and answer.headers["location"] == "/dashboard"
        attributes = [part.strip() for part in session_cookie(answer).split(";")]
        assert "HttpOnly" in attributes
        assert "SameSite=Strict" in attributes
        assert "Path=/dashboard" in attributes
        assert "Secure" not in attributes  # plain http: a Secure cookie would never come back
        assert not any(a.startswith(("Max-Age", "Expires", "Domain")) for a in attributes)
        # The API never takes the cookie for a key.
        assert (
            await client.get(
                "/v1/queues", headers={"Cookie": f"jobq_session={dashboard_keys.viewer}"}
            )
        ).status_code == 401


async def test_over_https_every_dashboard_cookie_is_secure(
    app: FastAPI, dashboard_keys: DashboardKeys
) -> None:
    async with browser(app, base_url="https://jobq.test") as client:
        form = await client.get("/dashboard/login")
        [nonce] = form.headers.get_list("set-cookie")
        assert nonce.startswith("jobq_csrf=") and "Secure" in nonce and "SameSite=Strict" in nonce
        answer = await client.post(
            "/dashboard/login", data={"key": dashboard_keys.admin, "csrf": csrf_of(form.text)}
        )
        assert answer.status_code == 303
        assert "Secure" in [p.strip() for p in session_cookie(answer).split(";")]
        assert (await client.get("/dashboard")).status_code == 200
        token = await page_token(client)
        paused = await client.post("/dashboard/queues/emails/pause", data={"csrf": token})
        flash = [c for c in paused.headers.get_list("set-cookie") if c.startswith("jobq_flash=")]
        assert flash and "Secure" in flash[0] and "HttpOnly" in flash[0]


async def test_sign_out_clears_the_session(app: FastAPI, dashboard_keys: DashboardKeys) -> None:
    async with signed_in(app, dashboard_keys.viewer) as client:
        token = await page_token(client)
        refused = await client.post("/dashboard/logout", data={"csrf": "0" * 64})
        assert refused.status_code == 403
        assert (await client.get("/dashboard")).status_code == 200
        answer = await client.post("/dashboard/logout", data={"csrf": token})
        assert answer.status_code == 303 and answer.headers["location"] == "/dashboard/login"
        cleared = session_cookie(answer)
        assert cleared.startswith("jobq_session=;") and "Max-Age=0" in cleared
        assert "Path=/dashboard" in cleared
        assert (await client.get("/dashboard")).status_code == 303


async def test_a_revoked_keys_session_stops_at_the_next_request(
    app: FastAPI, dashboard_keys: DashboardKeys, clean_db: AsyncEngine
) -> None:
    async with signed_in(app, dashboard_keys.admin) as client:
        assert (await client.get("/dashboard/workers")).status_code == 200
        async with clean_db.begin() as conn:
            assert await store.revoke_key(conn, name="admin")
        await app_state(app).running().keys.refresh()  # what the key notification triggers
        answer = await client.get("/dashboard/workers")
        assert answer.status_code == 303
        assert answer.headers["location"].startswith("/dashboard/login")
        assert session_cookie(answer).startswith("jobq_session=;")  # the dead cookie is dropped
        fragment = await client.get(
            "/dashboard/fragments/workers",
            headers={"HX-Request": "true", "Cookie": f"jobq_session={dashboard_keys.admin}"},
        )
        assert fragment.status_code == 401 and fragment.headers["hx-redirect"].startswith(
            "/dashboard/login"
        )
        # Signing in again with it fails too.
        assert (await sign_in(client, dashboard_keys.admin)).status_code == 401


async def test_an_action_with_a_missing_or_forged_token_is_refused_and_changes_nothing(
    app: FastAPI, dashboard_keys: DashboardKeys, seeded: Seeded
) -> None:
    async with signed_in(app, dashboard_keys.viewer) as viewer:
        viewers_token = await page_token(viewer)
    forgeries = {
        "missing": None,
        "empty": "",
        "random": "ab" * 32,
        "another session's": viewers_token,
        "the key itself": dashboard_keys.admin,
        "HMAC with another context": hmac.new(
            dashboard_keys.admin.encode(), b"something else", hashlib.sha256
        ).hexdigest(),
    }
    async with signed_in(app, dashboard_keys.admin) as admin:
        for what, token in forgeries.items():
            fields = {} if token is None else {"csrf": token}
            for path in (
                f"/dashboard/jobs/{seeded.pending}/cancel",
                f"/dashboard/jobs/{seeded.dead}/retry",
                "/dashboard/queues/emails/pause",
            ):
                answer = await admin.post(path, data=fields)
                assert answer.status_code == 403, (what, path)
                assert "security token" in answer.text
            bulk = await admin.post(
                "/dashboard/jobs/bulk", data={**fields, "action": "cancel", "queue": "emails"}
            )
            assert bulk.status_code == 403, what
        assert str(await job_status(app, seeded.pending)) == "pending"
        assert str(await job_status(app, seeded.dead)) == "dead"
        stats = await app_state(app).running().services.ops.queue_stats()
        assert not any(r.paused for r in stats)
        entries, _ = (
            await app_state(app)
            .running()
            .services.ops.audit_list(action=None, actor="admin", limit=50, after=None)
        )
        assert [
            e for e in entries if e.action != "job.cancel" or e.job_id != seeded.cancelled
        ] == []

        # The right token, as a form field or as htmx's header, works and is audited.
        token = await page_token(admin)
        cancel = await admin.post(f"/dashboard/jobs/{seeded.pending}/cancel", data={"csrf": token})
        assert cancel.status_code == 303
        retry = await admin.post(
            f"/dashboard/jobs/{seeded.dead}/retry", headers={"X-CSRF-Token": token}
        )
        assert retry.status_code == 303
        assert str(await job_status(app, seeded.pending)) == "cancelled"
        assert str(await job_status(app, seeded.dead)) == "pending"
        audit = await admin.get("/dashboard/audit")
        assert f'href="/dashboard/jobs/{seeded.pending}"' in audit.text
        entries, _ = (
            await app_state(app)
            .running()
            .services.ops.audit_list(action=None, actor="admin", limit=50, after=None)
        )
        done = {(e.action, e.job_id) for e in entries}
        assert {("job.cancel", seeded.pending), ("job.retry", seeded.dead)} <= done
        keyed = {e.actor_key_id for e in entries if e.job_id in (seeded.pending, seeded.dead)}
        admin_id = int(dashboard_keys.admin.split("_")[1])
        assert keyed == {admin_id}


async def test_the_token_is_per_session_and_stable_across_pages(
    app: FastAPI, dashboard_keys: DashboardKeys
) -> None:
    async with (
        signed_in(app, dashboard_keys.admin) as one,
        signed_in(app, dashboard_keys.admin) as two,
    ):
        assert await page_token(one) == await page_token(two, "/dashboard/workers")
    async with (
        signed_in(app, dashboard_keys.viewer) as viewer,
        signed_in(app, dashboard_keys.admin) as admin,
    ):
        assert await page_token(viewer) != await page_token(admin)
        assert (
            dashboard_keys.admin not in (await admin.get("/dashboard")).text
        )  # the key is never on a page


async def test_the_api_ignores_dashboard_cookies(
    app: FastAPI, dashboard_keys: DashboardKeys, seeded: Seeded
) -> None:
    async with signed_in(app, dashboard_keys.admin) as admin:
        answer = await admin.post(f"/v1/jobs/{seeded.pending}/cancel")
        assert answer.status_code == 401
    async with api(app, dashboard_keys.admin) as client:
        assert (await client.get(f"/v1/jobs/{seeded.pending}")).json()["status"] == "pending"
