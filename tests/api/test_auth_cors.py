"""CORS is off unless origins are listed, and never allows credentials."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
from asgi_lifespan import LifespanManager
from sqlalchemy.ext.asyncio import AsyncEngine

from app.main import create_app
from app.settings import Settings

PREFLIGHT = {
    "Origin": "https://ops.example",
    "Access-Control-Request-Method": "POST",
    "Access-Control-Request-Headers": "authorization, content-type",
}


async def _client(database_url: str, **settings: str) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(Settings(database_url=database_url, maintenance_enabled=False, **settings))
    async with LifespanManager(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://jobq.test") as client:
            yield client


@pytest.fixture
async def plain(database_url: str, clean_db: AsyncEngine) -> AsyncIterator[httpx.AsyncClient]:
    async for client in _client(database_url):
        yield client


@pytest.fixture
async def listed(database_url: str, clean_db: AsyncEngine) -> AsyncIterator[httpx.AsyncClient]:
    async for client in _client(
        database_url, cors_origins="https://ops.example, https://b.example"
    ):
        yield client


async def test_without_origins_no_cors_headers_at_all(plain: httpx.AsyncClient) -> None:
    preflight = await plain.options("/v1/claim", headers=PREFLIGHT)
    assert "access-control-allow-origin" not in preflight.headers
    answer = await plain.get("/v1/queues", headers={"Origin": "https://ops.example"})
    assert answer.status_code == 200
    assert "access-control-allow-origin" not in answer.headers


async def test_listed_origins_are_allowed_without_credentials(listed: httpx.AsyncClient) -> None:
    preflight = await listed.options("/v1/claim", headers=PREFLIGHT)
    assert preflight.status_code == 200
    assert preflight.headers["access-control-allow-origin"] == "https://ops.example"
    assert "authorization" in preflight.headers["access-control-allow-headers"].lower()
    assert "access-control-allow-credentials" not in preflight.headers
    # The hot routes (answered ahead of FastAPI's stack) carry the headers too.
    claim = await listed.post(
        "/v1/claim",
        json={"worker_id": "w", "queues": ["q"]},
        headers={"Origin": "https://ops.example"},
    )
    assert claim.status_code == 200
    assert claim.headers["access-control-allow-origin"] == "https://ops.example"
    other = await listed.get("/v1/queues", headers={"Origin": "https://evil.example"})
    assert "access-control-allow-origin" not in other.headers
