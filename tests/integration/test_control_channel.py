"""Wake-ups buffered in the control channel survive a shutdown that cuts their flush (audit bug 7)."""

from __future__ import annotations

import asyncio

import asyncpg
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

from app.db import async_url
from app.queue.waiters import WaiterHub
from app.wakeup.control import CHANNEL, ControlChannel, decode_payload
from tests.integration.helpers import repository
from tests.polling import poll_until


async def test_wake_ups_queued_when_stop_cuts_the_flush_are_still_sent(database_url: str) -> None:
    heard: list[str] = []
    listener = await asyncpg.connect(database_url.replace("+asyncpg", ""))
    await listener.add_listener(CHANNEL, lambda *args: heard.append(args[-1]))
    engine = create_async_engine(async_url(database_url), poolclass=NullPool)
    control = ControlChannel(engine=engine, repository=repository(), hub=WaiterHub())
    control.start()
    try:
        assert await control.wait_connected(5)
        # Another statement holds the one connection, so the flush waits for it...
        await control._io.acquire()
        control.announce("emails", 3)
        flush = control._flush_task
        assert flush is not None
        # ...when the shutdown comes and, after its grace, cancels the flush.
        stopping = asyncio.ensure_future(control.stop())
        await poll_until(flush.done, within=5, what="the flush to be cancelled")
        assert flush.cancelled()
        control._io.release()
        await asyncio.wait_for(stopping, 5)
        await poll_until(lambda: bool(heard), within=5, what="the notification")
    finally:
        await listener.close()
        await engine.dispose()
    decoded = [decode_payload(p) for p in heard]
    assert [(d[1], d[2]) for d in decoded if d] == [(3, "emails")]
