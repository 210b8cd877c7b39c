"""Noticing that the HTTP client went away while a long-polling request waits."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from fastapi import Request


@contextlib.asynccontextmanager
async def client_gone(request: Request) -> AsyncIterator[asyncio.Event]:
    """An event set when the HTTP client disconnects (watched only for the span of the block).

    For requests whose body was read already, or that have none: the next message is the
    disconnect (or, for a request without a body, its empty body first, then the disconnect).
    """
    gone = asyncio.Event()

    async def watch() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass
        gone.set()

    watcher = asyncio.create_task(watch(), name="jobq-request-disconnect")
    try:
        yield gone
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
