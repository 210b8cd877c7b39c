"""The app through ``httpx.AsyncClient`` on an ASGI transport, inside its lifespan."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
from asgi_lifespan import LifespanManager
from fastapi import FastAPI
from sqlalchemy.ext.asyncio import AsyncEngine

from app.main import create_app
from app.settings import Settings


@pytest.fixture
async def app(database_url: str, clean_db: AsyncEngine) -> AsyncIterator[FastAPI]:
    """The app on the session database, maintenance off (tests run the reaper by hand)."""
    application = create_app(
        Settings(database_url=database_url, maintenance_enabled=False, max_body_bytes=64 * 1024)
    )
    async with LifespanManager(application):
        yield application


@pytest.fixture
async def client(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    """An HTTP client talking to the app in process."""
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://jobq.test") as c:
        yield c
