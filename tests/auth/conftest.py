"""Keys for the auth tests: one of each role, and scoped ones, made in the session database.

The app fixture starts with no key (authentication off); ``keys`` makes them and reloads the
app's key ring, so authentication is on from then on. ``clean_db`` empties ``api_keys`` between
tests, so no other test ever sees a key.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy.ext.asyncio import AsyncEngine

from app.api.state import app_state
from app.auth import store
from app.auth.keys import Role
from tests.api.conftest import app as app_fixture
from tests.api.conftest import client as client_fixture

# The in-process app and its client, as in tests/api/, under their own names here.
app = app_fixture
client = client_fixture


async def make_key(
    engine: AsyncEngine, name: str, role: Role, queues: Sequence[str] | None = None
) -> str:
    """Creates a key as ``jobq keys create`` does; answers its secret."""
    async with engine.begin() as conn:
        return await store.create_key(conn, name=name, role=role, queues=queues)


@dataclass(frozen=True)
class Keys:
    """Secrets by use."""

    producer: str
    worker: str
    worker_b: str
    viewer: str
    admin: str
    # Each limited to queues other than "emails" (the queue the tests use).
    scoped_producer: str
    scoped_worker: str
    scoped_viewer: str
    scoped_admin: str

    def by_role(self, role: str) -> str:
        secret: str = getattr(self, role)
        return secret


def bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


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


def as_key(client: httpx.AsyncClient, secret: str | None) -> httpx.AsyncClient:
    """The same app, sending this key (or none)."""
    headers = bearer(secret) if secret is not None else {}
    return httpx.AsyncClient(transport=client._transport, base_url=client.base_url, headers=headers)
