"""One rule for a job's callback_url, whichever way the job is made (issue 40, item 4).

Every refused form goes through every way of making a job over HTTP: one job, a batch, a batch's
callback, a queue's default, a workflow's step. Each is a 422 problem naming the field, and
nothing is written.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.api.helpers import running_app

URL_MAX = 100
SETTINGS = {"webhook_secret": "whsec_callback_rules", "webhook_url_max_chars": URL_MAX}

REFUSED = {
    "gopher scheme": "gopher://127.0.0.1:25/_x",
    "loopback v6 literal": "http://[::1]/",
    "user in authority": "https://token@example.com/",
    "CR LF": "https://example.com/a\r\nX-Injected: 1",
    "over the length limit": "https://example.com/" + "x" * URL_MAX,
}

# (method, path, body with the URL in it, the field named)
WAYS: dict[str, tuple[str, str, Any, str]] = {
    "single": ("POST", "/v1/jobs", {"type": "t", "callback_url": None}, "body.callback_url"),
    "batch": (
        "POST",
        "/v1/jobs/batch",
        {"jobs": [{"type": "t"}, {"type": "t", "callback_url": None}]},
        "body.jobs[1].callback_url",
    ),
    "batch callback": (
        "POST",
        "/v1/jobs/batch",
        {"jobs": [{"type": "t"}], "callback": {"type": "cb", "callback_url": None}},
        "body.callback.callback_url",
    ),
    "queue default": ("PUT", "/v1/queues/hooks", {"callback_url": None}, "body.callback_url"),
    "workflow step": (
        "POST",
        "/v1/workflows",
        {
            "name": "w",
            "steps": [
                {"name": "a", "type": "t"},
                {"name": "b", "type": "t", "after": ["a"], "callback_url": None},
            ],
        },
        "body.steps[1].callback_url",
    ),
}


def _with_url(body: Any, url: str) -> Any:
    """The body with every ``callback_url: None`` placeholder set to ``url``."""
    if isinstance(body, dict):
        return {k: url if k == "callback_url" else _with_url(v, url) for k, v in body.items()}
    if isinstance(body, list):
        return [_with_url(v, url) for v in body]
    return body


async def _rows(engine: AsyncEngine) -> tuple[int, int, int]:
    async with engine.connect() as conn:
        jobs = await conn.scalar(text("SELECT count(*) FROM jobs"))
        workflows = await conn.scalar(text("SELECT count(*) FROM workflows"))
        hooks = await conn.scalar(
            text("SELECT count(*) FROM queues WHERE callback_url IS NOT NULL")
        )
    return int(jobs or 0), int(workflows or 0), int(hooks or 0)


@pytest.mark.parametrize("form", sorted(REFUSED))
async def test_each_refused_callback_url_is_refused_by_every_way_of_making_a_job(
    database_url: str, clean_db: AsyncEngine, form: str
) -> None:
    url = REFUSED[form]
    async with running_app(database_url, **SETTINGS) as client:
        for way, (method, path, body, field) in WAYS.items():
            r = await client.request(method, path, json=_with_url(body, url))
            assert r.status_code == 422, (way, r.status_code, r.text)
            assert r.headers["content-type"].startswith("application/problem+json"), way
            assert [e["field"] for e in r.json()["errors"]] == [field], (way, r.text)
    assert await _rows(clean_db) == (0, 0, 0)


async def test_an_allowed_callback_url_is_taken_by_every_way_of_making_a_job(
    database_url: str, clean_db: AsyncEngine
) -> None:
    url = "https://hooks.example.com/done?x=1"
    async with running_app(database_url, **SETTINGS) as client:
        for way, (method, path, body, _) in WAYS.items():
            r = await client.request(method, path, json=_with_url(body, url))
            assert r.status_code in (200, 201), (way, r.text)
        made = await _callbacks(client)
    assert made == {url}


async def _callbacks(client: httpx.AsyncClient) -> set[str]:
    jobs = (await client.get("/v1/jobs", params={"limit": 100})).json()["jobs"]
    return {j["callback_url"] for j in jobs if j["callback_url"] is not None}
