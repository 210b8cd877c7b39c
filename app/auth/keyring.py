"""The keys an instance knows, held in process: authentication costs no database round trip.

The ring loads every live key at start-up and again whenever ``jobq_keys`` is notified (a key
was made or revoked; the control connection listens) or that connection comes back, and every
``refresh_seconds`` in case a notification was lost some other way. A revoked key therefore
stops working on every instance within moments of its revocation committing.

A well-formed secret the ring does not know may belong to a key made a moment ago, before the
notification arrived: that one is looked up once in the database (callers count such misses
against the client's failure budget, so the lookup cannot be used to load the database).

Until the first load succeeds the ring knows nothing, so it refuses every request (503) rather
than take "no keys" for "authentication off". The ring is also a loop of the instance's runner
(app/maintenance/runner.py): its periodic reload is supervised, and /readyz fails if it stalls.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from app.auth import store
from app.auth.keys import Principal, digest, well_formed
from app.errors import brief

logger = logging.getLogger("jobq.auth")


class KeyRing:
    """Live keys by the SHA-256 of their secret, and whether authentication is on."""

    name = "keys"
    leader_only = False
    batch_size = None

    def __init__(self, engine: AsyncEngine, *, interval_seconds: float = 10.0) -> None:
        if not interval_seconds > 0:
            raise ValueError("interval_seconds must be > 0")
        self.engine = engine
        self.interval_seconds = interval_seconds
        self._by_digest: dict[bytes, Principal] = {}
        # On once any key exists (revoked ones count), and never off again while running.
        self.enabled = False
        self.loaded = asyncio.Event()
        self._refreshing: asyncio.Task[None] | None = None
        self._again = False

    async def _read(self, work: Callable[[AsyncConnection], Awaitable[Any]]) -> Any:
        async with self.engine.connect() as conn:
            return await work(conn)

    async def refresh(self) -> None:
        """Reloads every live key from the database."""
        live, any_key = await self._read(store.live_keys)
        self._by_digest = live
        if any_key and not self.enabled:
            logger.info("authentication is on: requests need an API key")
        self.enabled = self.enabled or any_key
        self.loaded.set()

    async def run_batch(self) -> int:
        """The periodic reload (the runner's unit of work); answers how many keys are live."""
        await self.refresh()
        return len(self._by_digest)

    def changed(self) -> None:
        """Keys changed (or may have): reload soon, once, however often this is called."""
        if self._refreshing is not None and not self._refreshing.done():
            self._again = True
            return
        self._refreshing = asyncio.get_running_loop().create_task(
            self._refresh_until_settled(), name="jobq-keys-refresh"
        )

    async def _refresh_until_settled(self) -> None:
        while True:
            self._again = False
            try:
                await self.refresh()
            except Exception as exc:  # noqa: BLE001 - any failure: keep the old keys, retry later
                logger.warning("reloading API keys failed: %s", brief(exc))
            if not self._again:
                return

    async def stop(self) -> None:
        """Waits out a reload in flight."""
        task = self._refreshing
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def known(self, secret: str) -> Principal | None:
        """The live key with this secret, from memory only."""
        return self._by_digest.get(digest(secret))

    async def authenticate(self, secret: str) -> Principal | None:
        """The live key with this secret: from memory, or for a new well-formed one, the database."""
        found = self.known(secret)
        if found is not None or not well_formed(secret):
            return found
        secret_digest = digest(secret)

        async def lookup(conn: AsyncConnection) -> Principal | None:
            return await store.key_by_digest(conn, secret_digest)

        found = await self._read(lookup)
        if isinstance(found, Principal):
            self._by_digest[secret_digest] = found
            self.enabled = True
            return found
        return None
