"""The dashboard through ``httpx.AsyncClient`` on the real app: browsers with cookie jars, keys, jobs.

The app fixture (tests/api/conftest.py) starts with no key, so authentication is off until
``dashboard_keys`` makes some and reloads the ring. A "browser" is a client that keeps cookies
and never follows redirects, so each test sees the 303s; jobs are seeded through the HTTP API,
as producers and workers would make them.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx
from fastapi import FastAPI

from app.api.state import app_state
from tests.api.helpers import claim, enqueue, lease, lease_call
from tests.keys import bearer

BASE_URL = "http://jobq.test"
HOSTILE = "<script>alert('owned')</script>"
_CSRF = re.compile(r'name="csrf" value="([0-9a-f]+)"')


@dataclass(frozen=True)
class DashboardKeys:
    """Secrets by use."""

    viewer: str
    admin: str
    worker: str
    producer: str
    scoped_viewer: str  # billing.* only
    scoped_admin: str  # billing.* only


def browser(app: FastAPI, base_url: str = BASE_URL) -> httpx.AsyncClient:
    """A client with a cookie jar that does not follow redirects, like a browser under test."""
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url=base_url, follow_redirects=False
    )


def api(app: FastAPI, secret: str | None = None) -> httpx.AsyncClient:
    """A client of the HTTP API, with this key (or none)."""
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app),
        base_url=BASE_URL,
        headers=bearer(secret) if secret else {},
    )


def csrf_of(html: str) -> str:
    """The CSRF token of a page's forms."""
    found = _CSRF.search(html)
    assert found is not None, html[:2000]
    return found.group(1)


async def sign_in(client: httpx.AsyncClient, secret: str) -> httpx.Response:
    """Opens the sign-in form and posts the key, as a person would."""
    form = await client.get("/dashboard/login")
    assert form.status_code == 200, form.text
    return await client.post("/dashboard/login", data={"key": secret, "csrf": csrf_of(form.text)})


@asynccontextmanager
async def signed_in(
    app: FastAPI, secret: str, base_url: str = BASE_URL
) -> AsyncIterator[httpx.AsyncClient]:
    """A browser with a session for this key."""
    async with browser(app, base_url) as client:
        answer = await sign_in(client, secret)
        assert answer.status_code == 303, answer.text
        yield client


async def page_token(client: httpx.AsyncClient, path: str = "/dashboard") -> str:
    """The CSRF token the session's pages carry."""
    answer = await client.get(path)
    assert answer.status_code == 200, answer.text
    return csrf_of(answer.text)


@dataclass(frozen=True)
class Seeded:
    """Job ids, one per state, plus the hostile one."""

    pending: int
    scheduled: int
    running: int
    succeeded: int
    dead: int
    cancelled: int
    hostile: int


async def seed_jobs(client: httpx.AsyncClient) -> Seeded:
    """A job in each state, in a few queues; the dead one failed twice with hostile text.

    ``client`` calls the API as producer, worker and admin (an admin key, or none when
    authentication is off).
    """
    producer = worker = client
    pending = await enqueue(producer, queue="emails", type="welcome", payload={"user": 42})
    hostile = await enqueue(
        producer, queue="emails", type=f"t{HOSTILE}", payload={"html": HOSTILE, "user": 7}
    )
    scheduled = await enqueue(producer, queue="later", type="report", delay_seconds=3600)

    running = await enqueue(producer, queue="long", type="export", payload={"rows": 20})
    [held] = await claim(worker, worker="host-a:1", queues=["long"], lease_seconds=300)
    await lease_call(
        worker,
        "heartbeat",
        "host-a:1",
        lease(held, progress={"done": 8, "total": 20}, checkpoint={"last_id": 800}),
    )

    succeeded = await enqueue(producer, queue="fast", type="ping")
    [done] = await claim(worker, worker="host-b:2", queues=["fast"])
    await lease_call(worker, "complete", "host-b:2", lease(done, result={"echo": HOSTILE}))

    dead = await enqueue(producer, queue="flaky", type="charge", max_attempts=2)
    for attempt in (1, 2):
        [failing] = await claim(worker, worker=f"host-{HOSTILE}", queues=["flaky"])
        await lease_call(
            worker,
            "fail",
            f"host-{HOSTILE}",
            lease(failing, error=f"attempt {attempt} broke: {HOSTILE}", retry_after_seconds=0),
        )

    cancelled = await enqueue(producer, queue="emails", type="welcome", payload={"user": 43})
    answer = await client.post(f"/v1/jobs/{cancelled['id']}/cancel")
    assert answer.status_code == 200, answer.text
    return Seeded(
        pending=pending["id"],
        scheduled=scheduled["id"],
        running=running["id"],
        succeeded=succeeded["id"],
        dead=dead["id"],
        cancelled=cancelled["id"],
        hostile=hostile["id"],
    )


async def job_status(app: FastAPI, job_id: int) -> Any:
    """A job's state, read from the service."""
    return (await app_state(app).running().services.jobs.get(job_id)).status
