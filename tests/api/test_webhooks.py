"""Completion webhooks through the ASGI app: callback_url on enqueue and as a queue default, the
refusals (422 naming the field), the key's secret, a job's deliveries and its history."""

from __future__ import annotations

from typing import Any

import httpx
from fastapi import FastAPI
from sqlalchemy.ext.asyncio import AsyncEngine

from app.api.state import app_state
from app.maintenance.webhooks import WebhookDeliveries
from app.settings import Settings
from jobq_client import verify_signature
from tests.api.helpers import claim, enqueue, lease_call, running_app
from tests.keys import Keys
from tests.webhook_receiver import receiver

SECRET = "whsec_api_tests_secret_value"
HOOKS = {"webhook_secret": SECRET, "webhook_allowed_networks": "127.0.0.1/32"}


def _loop(client: httpx.AsyncClient, settings: Settings | None = None) -> WebhookDeliveries:
    """A delivery loop on the app's services, built as the lifespan would build it."""
    from app.main import _loops

    app: FastAPI = client.app  # type: ignore[attr-defined]
    state = app_state(app)
    runtime = state.running()
    chosen = settings or state.settings.model_copy(update={"maintenance_enabled": True})
    [loop] = [
        lp
        for lp in _loops(chosen, runtime.services, runtime.hub)
        if isinstance(lp, WebhookDeliveries)
    ]
    return loop


def _problem_fields(response: httpx.Response) -> list[str]:
    assert response.status_code == 422, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    return [e["field"] for e in response.json()["errors"]]


async def test_callback_url_is_stored_shown_and_delivered_signed_with_its_history(
    database_url: str, clean_db: AsyncEngine
) -> None:
    async with receiver() as hook, running_app(database_url, **HOOKS) as client:
        job = await enqueue(client, queue="q", callback_url=hook.url("/done?x=1"))
        assert job["callback_url"] == hook.url("/done?x=1")
        r = await client.get(f"/v1/jobs/{job['id']}")
        assert r.json()["callback_url"] == hook.url("/done?x=1")
        [held] = await claim(client, queues=["q"])
        await lease_call(
            client, "complete", "w1", {"job_id": held["id"], "lease_id": held["lease_id"]}
        )
        assert (await _loop(client).run_once()).delivered == 1
        [got] = hook.received
        assert got.path == "/done?x=1"
        verify_signature(got.body, got.headers["jobq-signature"], SECRET)
        assert got.json["job_id"] == job["id"] and got.json["status"] == "succeeded"
        events = (await client.get(f"/v1/jobs/{job['id']}/events")).json()["events"]
        [hook_event] = [e for e in events if e["kind"] == "webhook"]
        assert hook_event["data"]["outcome"] == "delivered"
        assert hook_event["data"]["delivery_id"] == got.delivery_id
        listed = (await client.get(f"/v1/jobs/{job['id']}/webhooks")).json()["deliveries"]
        assert [(d["id"], d["state"], d["attempts"]) for d in listed] == [
            (got.delivery_id, "delivered", 1)
        ]


async def test_refused_callbacks_are_422_naming_the_field(
    database_url: str, clean_db: AsyncEngine
) -> None:
    async with running_app(database_url, webhook_secret=SECRET) as client:
        for url in (
            "http://127.0.0.1:9/hook",  # loopback, not allowed by default
            "http://localhost/hook",
            "http://[fd00::1]/hook",
            "ftp://example.com/x",
            "https://example.com/" + "x" * 2100,
        ):
            r = await client.post("/v1/jobs", json={"type": "t", "callback_url": url})
            assert _problem_fields(r) == ["body.callback_url"], url
        r = await client.post(
            "/v1/jobs/batch",
            json={"jobs": [{"type": "t"}, {"type": "t", "callback_url": "http://10.0.0.1/"}]},
        )
        assert _problem_fields(r) == ["body.jobs[1].callback_url"]
        r = await client.put("/v1/queues/q", json={"callback_url": "http://169.254.169.254/"})
        assert _problem_fields(r) == ["body.callback_url"]


async def test_without_keys_and_without_a_secret_callbacks_are_refused(
    client: httpx.AsyncClient,
) -> None:
    r = await client.post("/v1/jobs", json={"type": "t", "callback_url": "https://example.com/"})
    assert _problem_fields(r) == ["body.callback_url"]
    assert "JOBQ_WEBHOOK_SECRET" in r.json()["detail"]
    r = await client.post(
        "/v1/jobs/batch",
        json={"jobs": [{"type": "t"}, {"type": "t", "callback_url": "https://example.com/"}]},
    )
    assert _problem_fields(r) == ["body.jobs[1].callback_url"]
    r = await client.put("/v1/queues/q", json={"callback_url": "https://example.com/"})
    assert _problem_fields(r) == ["body.callback_url"]
    # Jobs without a callback are not concerned.
    assert (await client.post("/v1/jobs", json={"type": "t"})).status_code == 201


async def test_the_queue_default_applies_to_jobs_naming_none(
    database_url: str, clean_db: AsyncEngine
) -> None:
    async with running_app(database_url, **HOOKS) as client:
        r = await client.put("/v1/queues/hooked", json={"callback_url": "https://example.com/d"})
        assert r.status_code == 201, r.text
        assert r.json() == {
            "name": "hooked",
            "paused": False,
            "callback_url": "https://example.com/d",
        }
        # Pausing keeps the default; an unset field keeps it too.
        r = await client.post("/v1/queues/hooked/pause")
        assert r.json()["callback_url"] == "https://example.com/d"
        r = await client.put("/v1/queues/hooked", json={"paused": False})
        assert r.json()["callback_url"] == "https://example.com/d"
        defaulted = await enqueue(client, queue="hooked")
        own = await enqueue(client, queue="hooked", callback_url="https://example.org/own")
        other = await enqueue(client, queue="plain")
        r = await client.post(
            "/v1/jobs/batch",
            json={"jobs": [{"queue": "hooked", "type": "t"}, {"queue": "plain", "type": "t"}]},
        )
        batch = r.json()["jobs"]
        assert [defaulted["callback_url"], own["callback_url"], other["callback_url"]] == [
            "https://example.com/d",
            "https://example.org/own",
            None,
        ]
        assert [j["callback_url"] for j in batch] == ["https://example.com/d", None]
        listed = {q["name"]: q for q in (await client.get("/v1/queues")).json()["queues"]}
        assert listed["hooked"]["callback_url"] == "https://example.com/d"
        r = await client.put("/v1/queues/hooked", json={"callback_url": None})
        assert r.json()["callback_url"] is None
        assert (await enqueue(client, queue="hooked"))["callback_url"] is None
        audit = (await client.get("/v1/audit")).json()["entries"]
        assert {"callback_url": "https://example.com/d"} in [e["detail"] for e in audit]


async def test_an_idempotent_replay_without_callback_matches_the_stored_fingerprint(
    database_url: str, clean_db: AsyncEngine
) -> None:
    async with running_app(database_url, **HOOKS) as client:
        first = await client.post("/v1/jobs", json={"type": "t", "idempotency_key": "k"})
        again = await client.post("/v1/jobs", json={"type": "t", "idempotency_key": "k"})
        assert (first.status_code, again.status_code) == (201, 200)
        other = await client.post(
            "/v1/jobs",
            json={"type": "t", "idempotency_key": "k", "callback_url": "https://example.com/"},
        )
        assert other.status_code == 422


async def test_a_key_reads_and_rotates_its_secret_which_signs_its_jobs(
    app: FastAPI, client: httpx.AsyncClient, keys: Keys
) -> None:
    producer = {"Authorization": f"Bearer {keys.producer}"}
    r = await client.get("/v1/webhooks/secret", headers=producer)
    assert r.status_code == 200, r.text
    first = r.json()
    assert first["key_name"] == "producer" and first["secret"].startswith("whsec_")
    assert first["previous_secret"] is None
    r = await client.post("/v1/webhooks/secret/rotate", headers=producer)
    rotated = r.json()
    assert rotated["previous_secret"] == first["secret"] != rotated["secret"]
    assert rotated["previous_valid_until"] is not None
    assert (await client.get("/v1/webhooks/secret", headers=producer)).json() == rotated
    admin_audit = {"Authorization": f"Bearer {keys.admin}"}
    r = await client.get("/v1/audit?action=key.rotate_webhook_secret", headers=admin_audit)
    [entry] = r.json()["entries"]
    assert (entry["actor"], entry["key_name"], entry["outcome"]) == (
        "producer",
        "producer",
        "changed",
    )
    assert rotated["secret"] not in r.text and first["secret"] not in r.text
    # Each key has its own; a worker key enqueues nothing, so it has none to read.
    admin = {"Authorization": f"Bearer {keys.admin}"}
    assert (await client.get("/v1/webhooks/secret", headers=admin)).json()["secret"] not in (
        first["secret"],
        rotated["secret"],
    )
    worker = {"Authorization": f"Bearer {keys.worker}"}
    assert (await client.get("/v1/webhooks/secret", headers=worker)).status_code == 403
    # With keys, a callback needs no JOBQ_WEBHOOK_SECRET: the key's secret signs.
    r = await client.post(
        "/v1/jobs",
        json={"type": "t", "callback_url": "https://example.com/h"},
        headers=producer,
    )
    assert r.status_code == 201, r.text


async def test_without_keys_the_secret_route_says_where_the_secret_is(
    client: httpx.AsyncClient,
) -> None:
    r = await client.get("/v1/webhooks/secret")
    assert r.status_code == 409 and "JOBQ_WEBHOOK_SECRET" in r.json()["detail"]


async def test_a_scoped_key_sees_only_its_queues_deliveries(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    admin = {"Authorization": f"Bearer {keys.admin}"}
    r = await client.post(
        "/v1/jobs",
        json={"queue": "other", "type": "t", "callback_url": "https://example.com/"},
        headers=admin,
    )
    job: dict[str, Any] = r.json()
    scoped = {"Authorization": f"Bearer {keys.scoped_viewer}"}
    assert (await client.get(f"/v1/jobs/{job['id']}/webhooks", headers=scoped)).status_code == 403
    r = await client.get(f"/v1/jobs/{job['id']}/webhooks", headers=admin)
    assert r.json() == {"deliveries": []}


async def test_the_loop_runs_only_where_maintenance_does(app: FastAPI) -> None:
    from app.main import _loops

    state = app_state(app)
    runtime = state.running()
    for enabled in (True, False):
        settings = state.settings.model_copy(update={"maintenance_enabled": enabled})
        names = [loop.name for loop in _loops(settings, runtime.services, runtime.hub)]
        assert ("webhooks" in names) is enabled
