"""The role x route matrix, every cell, generated from openapi.json so a new route cannot be missed.

Each route needs one permission (app/auth/keys.py); docs/guides/security.md documents the same table. A cell
is: no key -> 401 with WWW-Authenticate: Bearer; a role without the permission -> 403; a role
with it -> neither (the route's own answer). Public routes answer everyone.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.auth.keys import Permission
from tests.keys import Keys, as_key

ROOT = Path(__file__).resolve().parents[2]
SPEC = json.loads((ROOT / "openapi.json").read_text(encoding="utf-8"))

PUBLIC = "public"
# What each route needs, as the matrix in docs/guides/security.md says. A route missing here fails the test below.
NEEDS: dict[tuple[str, str], str] = {
    ("POST", "/v1/jobs"): Permission.ENQUEUE,
    ("POST", "/v1/jobs/batch"): Permission.ENQUEUE,
    ("POST", "/v1/workflows"): Permission.ENQUEUE,
    ("GET", "/v1/workflows/{workflow_id}"): Permission.READ_JOBS,
    ("POST", "/v1/workflows/{workflow_id}/cancel"): Permission.OPERATE,
    ("POST", "/v1/workflows/{workflow_id}/retry"): Permission.OPERATE,
    ("GET", "/v1/jobs"): Permission.READ_JOBS,
    ("GET", "/v1/jobs/{job_id}"): Permission.READ_JOBS,
    ("POST", "/v1/jobs/{job_id}/cancel"): Permission.OPERATE,
    ("POST", "/v1/jobs/{job_id}/retry"): Permission.OPERATE,
    ("POST", "/v1/jobs/{job_id}/run-now"): Permission.OPERATE,
    ("GET", "/v1/jobs/{job_id}/events"): Permission.READ_JOBS,
    ("GET", "/v1/jobs/{job_id}/blockers"): Permission.READ_JOBS,
    ("GET", "/v1/jobs/{job_id}/webhooks"): Permission.READ_JOBS,
    ("GET", "/v1/webhooks/secret"): Permission.ENQUEUE,
    ("POST", "/v1/webhooks/secret/rotate"): Permission.ENQUEUE,
    ("GET", "/v1/failures"): Permission.OBSERVE,
    ("POST", "/v1/failures/{action}"): Permission.OPERATE,
    ("POST", "/v1/jobs/bulk/{action}"): Permission.OPERATE,
    ("POST", "/v1/claim"): Permission.WORK,
    ("POST", "/v1/heartbeat"): Permission.WORK,
    ("POST", "/v1/complete"): Permission.WORK,
    ("POST", "/v1/fail"): Permission.WORK,
    ("POST", "/v1/release"): Permission.WORK,
    ("GET", "/v1/queues"): Permission.OBSERVE,
    ("GET", "/v1/queues/{name}/stats"): Permission.OBSERVE,
    ("PUT", "/v1/queues/{name}"): Permission.OPERATE,
    ("DELETE", "/v1/queues/{name}"): Permission.OPERATE,
    ("POST", "/v1/queues/{name}/pause"): Permission.OPERATE,
    ("POST", "/v1/queues/{name}/resume"): Permission.OPERATE,
    ("GET", "/v1/workers"): Permission.OBSERVE,
    ("GET", "/v1/audit"): Permission.OBSERVE,
    ("GET", "/v1/maintenance/set-aside"): Permission.OBSERVE,
    ("DELETE", "/v1/maintenance/set-aside/{loop}/{job_id}"): Permission.OPERATE,
    ("GET", "/v1/limits"): Permission.OBSERVE,
    ("PUT", "/v1/limits"): Permission.OPERATE,
    ("DELETE", "/v1/limits/{limit_id}"): Permission.OPERATE,
    ("GET", "/v1/schedules"): Permission.OBSERVE,
    ("GET", "/v1/schedules/{name}"): Permission.OBSERVE,
    ("PUT", "/v1/schedules/{name}"): Permission.OPERATE,
    ("DELETE", "/v1/schedules/{name}"): Permission.OPERATE,
    ("POST", "/v1/schedules/{name}/pause"): Permission.OPERATE,
    ("POST", "/v1/schedules/{name}/resume"): Permission.OPERATE,
    ("POST", "/v1/schedules/{name}/trigger"): Permission.OPERATE,
    ("GET", "/metrics"): Permission.OBSERVE,  # not in the spec (Prometheus text)
    ("GET", "/healthz"): PUBLIC,
    ("GET", "/readyz"): PUBLIC,
}

# Who holds each permission: the matrix in docs/guides/security.md, written out here rather than read from the code.
HOLDERS: dict[str, set[str]] = {
    Permission.ENQUEUE: {"producer", "admin"},
    Permission.WORK: {"worker", "admin"},
    Permission.READ_JOBS: {"producer", "worker", "viewer", "admin"},
    Permission.OBSERVE: {"viewer", "admin"},
    Permission.OPERATE: {"admin"},
}

ROUTES = sorted(
    [(method.upper(), path) for path, item in SPEC["paths"].items() for method in item]
    + [("GET", "/metrics")]
)
CALLERS = ["none", "producer", "worker", "viewer", "admin"]

Request = Callable[[httpx.AsyncClient, dict[str, Any]], Awaitable[httpx.Response]]


async def _seed(admin: httpx.AsyncClient) -> dict[str, Any]:
    """A pending job, a leased one (with its lease) and a dead one, all in queue "emails"."""
    pending = (await admin.post("/v1/jobs", json={"queue": "emails", "type": "t"})).json()
    held = (await admin.post("/v1/jobs", json={"queue": "work", "type": "t"})).json()
    [lease] = (await admin.post("/v1/claim", json={"worker_id": "w", "queues": ["work"]})).json()[
        "jobs"
    ]
    assert lease["id"] == held["id"]
    schedule = {"interval_seconds": 3600, "template": {"queue": "emails", "type": "t"}}
    r = await admin.put("/v1/schedules/emails", json=schedule)
    assert r.status_code in (200, 201), r.text
    r = await admin.put(
        "/v1/limits", json={"scope": "queue", "pattern": "emails", "max_running": 5}
    )
    assert r.status_code in (200, 201), r.text
    limit = r.json()
    flow = {"name": "w", "steps": [{"name": "a", "queue": "emails", "type": "t"}]}
    r = await admin.post("/v1/workflows", json=flow)
    assert r.status_code == 201, r.text
    workflow = r.json()
    return {"pending": pending, "lease": lease, "limit": limit, "workflow": workflow}


def _body(method: str, path: str, seed: dict[str, Any]) -> dict[str, Any] | None:
    lease = {"job_id": seed["lease"]["id"], "lease_id": seed["lease"]["lease_id"]}
    return {
        ("POST", "/v1/jobs"): {"queue": "emails", "type": "t"},
        ("POST", "/v1/jobs/batch"): {"jobs": [{"queue": "emails", "type": "t"}]},
        ("POST", "/v1/workflows"): {
            "name": "w",
            "steps": [{"name": "a", "queue": "emails", "type": "t"}],
        },
        ("POST", "/v1/claim"): {"worker_id": "w", "queues": ["emails"]},
        ("POST", "/v1/heartbeat"): {"worker_id": "w", "leases": [lease]},
        ("POST", "/v1/complete"): {"worker_id": "w", "leases": [lease]},
        ("POST", "/v1/fail"): {"worker_id": "w", "leases": [lease]},
        ("POST", "/v1/release"): {"worker_id": "w", "leases": [lease]},
        ("POST", "/v1/jobs/bulk/{action}"): {"queue": "emails"},
        ("POST", "/v1/failures/{action}"): {
            "queue": "emails",
            "type": "t",
            "error_type": "failed",
            "fingerprint": "m:" + "0" * 32,
        },
        ("PUT", "/v1/limits"): {"scope": "queue", "pattern": "emails", "max_running": 3},
        ("PUT", "/v1/schedules/{name}"): {
            "interval_seconds": 60,
            "template": {"queue": "emails", "type": "t"},
        },
    }.get((method, path))


def _url(path: str, seed: dict[str, Any]) -> str:
    return (
        path.replace("{job_id}", str(seed["pending"]["id"]))
        .replace("{name}", "emails")
        .replace("{action}", "cancel")
        .replace("{limit_id}", str(seed["limit"]["id"]))
        .replace("{workflow_id}", str(seed["workflow"]["id"]))
        .replace("{loop}", "reaper")
    )


def test_every_route_of_the_spec_is_in_the_matrix() -> None:
    missing = [route for route in ROUTES if route not in NEEDS]
    assert not missing, f"routes without a documented permission: {missing}"
    stale = [route for route in NEEDS if route not in ROUTES]
    assert not stale, f"matrix rows for routes that are gone: {stale}"


def test_every_protected_route_documents_the_bearer_scheme() -> None:
    for method, path in ROUTES:
        if path == "/metrics":
            continue
        operation = SPEC["paths"][path][method.lower()]
        documented = operation.get("security") == [{"apiKey": []}]
        assert documented == (NEEDS[(method, path)] != PUBLIC), (method, path)


def _expected(need: str, caller: str) -> str:
    if need == PUBLIC:
        return "served"
    if caller == "none":
        return "401"
    return "served" if caller in HOLDERS[need] else "403"


@pytest.mark.parametrize("route", ROUTES, ids=lambda r: f"{r[0]} {r[1]}")
async def test_each_cell_of_the_matrix(
    client: httpx.AsyncClient, keys: Keys, route: tuple[str, str]
) -> None:
    method, path = route
    need = NEEDS[route]
    outcomes: dict[str, str] = {}
    for caller in CALLERS:
        async with as_key(client, keys.admin) as admin:
            seed = await _seed(admin)
        secret = None if caller == "none" else keys.by_role(caller)
        async with as_key(client, secret) as c:
            response = await c.request(method, _url(path, seed), json=_body(method, path, seed))
        if response.status_code == 401:
            assert response.headers["www-authenticate"].startswith("Bearer")
            assert response.headers["content-type"] == "application/problem+json"
            outcomes[caller] = "401"
        elif response.status_code == 403:
            assert response.headers["content-type"] == "application/problem+json"
            assert caller in response.json()["detail"] or "key" in response.json()["detail"]
            outcomes[caller] = "403"
        else:
            assert response.status_code < 500, response.text
            outcomes[caller] = "served"
    assert outcomes == {caller: _expected(need, caller) for caller in CALLERS}


@pytest.mark.parametrize("route", ROUTES, ids=lambda r: f"{r[0]} {r[1]}")
async def test_a_wrong_scope_key_of_the_right_role_is_refused_or_sees_nothing(
    client: httpx.AsyncClient, keys: Keys, route: tuple[str, str]
) -> None:
    """Keys scoped to billing.* against queue "emails": 403 where the request names the queue,
    an empty view where it lists, never the other team's jobs."""
    method, path = route
    need = NEEDS[route]
    if need == PUBLIC:
        return
    async with as_key(client, keys.admin) as admin:
        seed = await _seed(admin)
    secret = {
        Permission.ENQUEUE: keys.scoped_producer,
        Permission.WORK: keys.scoped_worker,
        Permission.READ_JOBS: keys.scoped_viewer,
        Permission.OBSERVE: keys.scoped_viewer,
        Permission.OPERATE: keys.scoped_admin,
    }[Permission(need)]
    async with as_key(client, secret) as c:
        response = await c.request(method, _url(path, seed), json=_body(method, path, seed))
    assert response.status_code < 500, response.text
    listings = {"/v1/jobs": "jobs", "/v1/queues": "queues", "/v1/workers": "workers"}
    listings |= {"/v1/audit": "entries", "/v1/limits": "limits", "/v1/schedules": "schedules"}
    listings |= {"/v1/failures": "groups", "/v1/maintenance/set-aside": "jobs"}
    if method == "GET" and path in listings:
        assert response.status_code == 200
        assert response.json()[listings[path]] == []
    elif route == ("GET", "/metrics"):
        assert response.status_code == 200  # instance figures only: no per-queue series
    elif path in {"/v1/heartbeat", "/v1/complete", "/v1/fail", "/v1/release"}:
        # The lease belongs to another key's worker: lost, not refused, and nothing changes.
        assert response.status_code == 200
        assert [r["ok"] for r in response.json()["results"]] == [False]
        assert response.json()["results"][0]["error"] == "lease_lost"
    elif path.startswith("/v1/webhooks/secret"):
        # The key's own secret, whatever its scopes: it names no queue.
        assert response.status_code == 200, response.text
    elif path.startswith("/v1/limits"):
        # A limit may reach any queue's jobs: only keys without scopes change them.
        assert response.status_code == 403, response.text
        assert response.json()["errors"][0]["message"] == "limits need an unscoped admin key"
    else:
        assert response.status_code == 403, response.text
        assert response.headers["content-type"] == "application/problem+json"
        assert response.json()["errors"][0]["message"] == "queue outside the key's scopes"
