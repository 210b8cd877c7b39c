"""The app through ``httpx.AsyncClient`` on an ASGI transport, inside its lifespan; keys for it.

The app starts with no key (authentication off); ``keys`` and ``dashboard_keys`` make some and
reload the app's key ring, so authentication is on from then on. ``clean_db`` empties
``api_keys`` between tests, so no other test ever sees a key.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
from asgi_lifespan import LifespanManager
from fastapi import FastAPI
from sqlalchemy.ext.asyncio import AsyncEngine

from app.api.state import app_state
from app.auth.keys import Role
from app.main import create_app
from app.settings import Settings
from tests.api.dashboard import DashboardKeys, Seeded, api, browser, seed_jobs
from tests.keys import Keys, make_key


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


@pytest.fixture
async def keys(app: FastAPI, clean_db: AsyncEngine) -> Keys:
    """A key of each role (and scoped ones), known to the running app."""
    made = Keys(
        producer=await make_key(clean_db, "producer", Role.PRODUCER),
        worker=await make_key(clean_db, "worker", Role.WORKER),
        worker_b=await make_key(clean_db, "worker-b", Role.WORKER),
        viewer=await make_key(clean_db, "viewer", Role.VIEWER),
        admin=await make_key(clean_db, "admin", Role.ADMIN),
        scoped_producer=await make_key(clean_db, "billing-producer", Role.PRODUCER, ["billing.*"]),
        scoped_worker=await make_key(clean_db, "billing-worker", Role.WORKER, ["billing.*"]),
        scoped_viewer=await make_key(clean_db, "billing-viewer", Role.VIEWER, ["billing.*"]),
        scoped_admin=await make_key(clean_db, "billing-admin", Role.ADMIN, ["billing.*"]),
    )
    await app_state(app).running().keys.refresh()
    return made


@pytest.fixture
async def dashboard_keys(app: FastAPI, clean_db: AsyncEngine) -> DashboardKeys:
    """A key of each role the dashboard cares about, known to the running app."""
    made = DashboardKeys(
        viewer=await make_key(clean_db, "viewer", Role.VIEWER),
        admin=await make_key(clean_db, "admin", Role.ADMIN),
        worker=await make_key(clean_db, "worker", Role.WORKER),
        producer=await make_key(clean_db, "producer", Role.PRODUCER),
        scoped_viewer=await make_key(clean_db, "billing-viewer", Role.VIEWER, ["billing.*"]),
        scoped_admin=await make_key(clean_db, "billing-admin", Role.ADMIN, ["billing.*"]),
    )
    await app_state(app).running().keys.refresh()
    return made


@pytest.fixture
async def anonymous(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    """A browser with no session."""
    async with browser(app) as client:
        yield client


@pytest.fixture
async def seeded(app: FastAPI, dashboard_keys: DashboardKeys) -> Seeded:
    """A job in each state, made with the admin key (authentication on)."""
    async with api(app, dashboard_keys.admin) as client:
        return await seed_jobs(client)
