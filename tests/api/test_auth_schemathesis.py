"""Schemathesis against the committed openapi.json: every answer is documented and none is a 5xx.

For each operation of the contract schemathesis (pinned in pyproject's ``test`` extra) draws
requests from the schema, valid ones and invalid ones, sends them with an admin key, and checks
each answer: not a server error; a status code the operation documents; the documented content
type; a body matching the documented schema. Generation is bounded (``MAX_EXAMPLES`` per
operation), derandomized with a fixed seed and without an example database, so a run is the
same every time (Hypothesis still caches constants under .hypothesis/, which ignores itself).

The app runs in process, on the session's database, inside a lifespan this module starts and
stops itself: an anyio portal thread owns the app's event loop, and a ``requests`` adapter hands
schemathesis' requests to the app there through ``httpx.ASGITransport``. (Schemathesis' own ASGI
transport would start the lifespan on a loop of its own and keep it until the session ends.)
Valid long-poll waits (claims' and ``claim_next``'s, and job reads' ``wait_seconds``) are cut to
``CLAIM_WAIT_SECONDS``; nothing else is changed.
"""

from __future__ import annotations

import io
import random
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import requests
import requests.adapters
import schemathesis
import urllib3
from anyio.from_thread import BlockingPortal, start_blocking_portal
from asgi_lifespan import LifespanManager
from schemathesis.config import SchemathesisConfig
from schemathesis.core.transport import Response
from schemathesis.generation.case import Case
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

from app.auth import store
from app.auth.keys import Role
from app.db import async_url
from app.main import create_app
from app.maintenance import runner as maintenance_runner
from app.settings import Settings
from app.wakeup import control as wakeup_control

ROOT = Path(__file__).resolve().parents[2]
BASE_URL = "http://jobq.test"
MAX_EXAMPLES = 50
SEED = 20261201
# A claim may long-poll up to 20 s on an empty queue; valid waits are cut to this for the run
# (tests/api/test_longpoll.py covers waiting itself).
CLAIM_WAIT_SECONDS = 0.05

CONFIG = SchemathesisConfig.from_dict(
    {
        "seed": SEED,
        "base-url": BASE_URL,
        "generation": {
            "max-examples": MAX_EXAMPLES,
            "deterministic": True,
            "database": "none",
            # The admin key goes on every request; the auth tests deal with other headers.
            "with-security-parameters": False,
        },
        "checks": {
            "enabled": False,
            "not_a_server_error": {"enabled": True},
            "status_code_conformance": {"enabled": True},
            "content_type_conformance": {"enabled": True},
            "response_schema_conformance": {"enabled": True},
        },
    }
)

schema = schemathesis.openapi.from_path(ROOT / "openapi.json", config=CONFIG)


def _cut_wait_short(case: Case[Any]) -> None:
    """Cuts a valid long-poll wait short, so an empty queue or an unfinished job costs no 20 s."""
    body = case.body
    claim: Any = body if case.operation.path == "/v1/claim" else None
    if case.operation.path in ("/v1/complete", "/v1/fail", "/v1/release") and isinstance(
        body, dict
    ):
        claim = body.get("claim_next")  # the claim made after the call's transition
    if isinstance(claim, dict):
        wait = claim.get("wait_seconds")
        if isinstance(wait, int | float) and not isinstance(wait, bool) and 0 < wait <= 20:
            claim["wait_seconds"] = min(wait, CLAIM_WAIT_SECONDS)
    query = case.query
    if case.operation.path == "/v1/jobs/{job_id}" and isinstance(query, dict):
        wait = query.get("wait_seconds")
        if isinstance(wait, int | float) and not isinstance(wait, bool) and 0 < wait <= 20:
            query["wait_seconds"] = min(wait, CLAIM_WAIT_SECONDS)


class InProcess(requests.adapters.HTTPAdapter):
    """A ``requests`` adapter that answers from the app, on the portal's event loop."""

    def __init__(self, portal: BlockingPortal, client: httpx.AsyncClient) -> None:
        super().__init__()
        self.portal = portal
        self.client = client

    def send(
        self, request: requests.PreparedRequest, *args: Any, **kwargs: Any
    ) -> requests.Response:
        body = request.body.encode("utf-8") if isinstance(request.body, str) else request.body
        if body is not None and not isinstance(body, bytes):
            raise TypeError("schemathesis sends whole bodies; a streamed one is not expected")
        headers = [
            (name, value if isinstance(value, str) else value.decode("latin-1"))
            for name, value in request.headers.items()
        ]

        async def exchange() -> httpx.Response:
            return await self.client.request(
                request.method or "GET",
                request.url or "/",
                headers=headers,
                content=body,
            )

        answer = self.portal.call(exchange)
        raw = urllib3.HTTPResponse(
            body=io.BytesIO(answer.content),
            headers=urllib3.HTTPHeaderDict(answer.headers.multi_items()),
            status=answer.status_code,
            reason=answer.reason_phrase,
            version=11,
            preload_content=False,
            decode_content=False,
        )
        return self.build_response(request, raw)


async def _reset(database_url: str) -> str:
    """Empties the tables and makes an admin key; answers its secret."""
    engine = create_async_engine(async_url(database_url), poolclass=NullPool)
    try:
        async with engine.begin() as conn:
            await conn.execute(
                text(
                    "TRUNCATE jobs, queues, api_keys, schedules, flow_limits, flow_state, flow_released, workers RESTART IDENTITY"
                )
            )
            return await store.create_key(conn, name="schemathesis", role=Role.ADMIN, queues=None)
    finally:
        await engine.dispose()


async def _empty(database_url: str) -> None:
    engine = create_async_engine(async_url(database_url), poolclass=NullPool)
    try:
        async with engine.begin() as conn:
            await conn.execute(
                text(
                    "TRUNCATE jobs, queues, api_keys, schedules, flow_limits, flow_state, flow_released, workers RESTART IDENTITY"
                )
            )
    finally:
        await engine.dispose()


async def _seed(client: httpx.AsyncClient) -> None:
    """Jobs with small ids (1..4) in several states, so drawn ids sometimes name a real job."""
    for queue in ("default", "emails", "emails", "work"):
        r = await client.post("/v1/jobs", json={"queue": queue, "type": "t", "payload": {"n": 1}})
        assert r.status_code == 201, r.text
    r = await client.post("/v1/claim", json={"worker_id": "w", "queues": ["work"]})
    assert r.status_code == 200 and r.json()["jobs"], r.text
    assert (await client.post("/v1/jobs/2/cancel")).status_code == 200
    assert (await client.post("/v1/queues/emails/pause")).status_code == 200


@asynccontextmanager
async def _running(database_url: str) -> AsyncIterator[httpx.AsyncClient]:
    secret = await _reset(database_url)
    app = create_app(Settings(database_url=database_url, maintenance_enabled=False))
    try:
        async with LifespanManager(app, startup_timeout=60, shutdown_timeout=60):
            transport = httpx.ASGITransport(app=app)
            headers = {"Authorization": f"Bearer {secret}"}
            async with httpx.AsyncClient(
                transport=transport, base_url=BASE_URL, headers=headers
            ) as client:
                await _seed(client)
                yield client
    finally:
        await _empty(database_url)  # no other test may see the key


@dataclass(frozen=True)
class Served:
    """The running app as schemathesis reaches it, and the headers every request carries."""

    session: requests.Session
    headers: dict[str, str]


@pytest.fixture(scope="module")
def served(database_url: str) -> Iterator[Served]:
    """The app running in process on the session's database, with an admin key."""
    with pytest.MonkeyPatch.context() as patch:
        # The app's loops draw their jitter from the global ``random`` on the portal thread;
        # Hypothesis, drawing on this one, would take that as its strategies using ``random``
        # (a HypothesisDeprecationWarning, an error here). Give them a generator of their own.
        for module in (maintenance_runner, wakeup_control):
            patch.setattr(module, "random", random.Random(SEED))
        with (
            start_blocking_portal() as portal,
            portal.wrap_async_context_manager(_running(database_url)) as client,
            requests.Session() as session,
        ):
            session.mount("http://", InProcess(portal, client))
            yield Served(session, {"Authorization": client.headers["Authorization"]})


@schema.parametrize()
def test_every_answer_is_documented_and_none_is_a_server_error(
    case: Case[Any], served: Served
) -> None:
    _cut_wait_short(case)
    response: Response = case.call_and_validate(session=served.session, headers=served.headers)
    assert response.status_code < 500
