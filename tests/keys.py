"""API keys for the tests: made in the session database as ``jobq keys create`` does, and sent.

The api tests' ``keys`` fixture (tests/api/conftest.py) makes one of each role with these; the
acceptance tests make the ones they need for their servers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import httpx
from sqlalchemy.ext.asyncio import AsyncEngine

from app.auth import store
from app.auth.keys import Role


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
        """The secret of the key named by ``role`` (a field name)."""
        secret: str = getattr(self, role)
        return secret


def bearer(secret: str) -> dict[str, str]:
    """The ``Authorization`` header that sends this secret."""
    return {"Authorization": f"Bearer {secret}"}


def as_key(client: httpx.AsyncClient, secret: str | None) -> httpx.AsyncClient:
    """The same app, sending this key (or none)."""
    headers = bearer(secret) if secret is not None else {}
    return httpx.AsyncClient(transport=client._transport, base_url=client.base_url, headers=headers)
