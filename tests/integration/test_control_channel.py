"""Wake-ups buffered in the control channel survive a shutdown that cuts their flush (audit bug 7)."""

from __future__ import annotations

import asyncio

import asyncpg
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

from app.db import async_url
from app.queue.waiters import WaiterHub
from app.store.control import ControlStore
from app.wakeup.control import CHANNEL, ControlChannel, decode_payload
from tests.polling import poll_until


async def test_wake_ups_queued_when_stop_cuts_the_flush_are_still_sent(database_url: str) -> None:
    heard: list[str] = []
    listener = await asyncpg.connect(database_url.replace("+asyncpg", ""))
    await listener.add_listener(CHANNEL, lambda *args: heard.append(args[-1]))
    engine = create_async_engine(async_url(database_url), poolclass=NullPool)
    control = ControlChannel(engine=engine, store=ControlStore(), hub=WaiterHub())
    control.start()
    try:
        assert await control.wait_connected(5)
        # Another instance says hello: only then does this one send wake-ups at all.
        await listener.execute("SELECT pg_notify($1, 'other-instance 0 ')", CHANNEL)
        await poll_until(lambda: bool(control.peers), within=5, what="the peer to be heard")
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
    wake_ups = [(d[1], d[2]) for d in decoded if d and d[0] == control.instance and d[1]]
    assert wake_ups == [(3, "emails")]


async def test_an_instance_alone_sends_no_wake_ups_and_learns_of_a_newcomer_at_once(
    database_url: str,
) -> None:
    heard: list[str] = []
    listener = await asyncpg.connect(database_url.replace("+asyncpg", ""))
    await listener.add_listener(CHANNEL, lambda *args: heard.append(args[-1]))
    engine = create_async_engine(async_url(database_url), poolclass=NullPool)
    alone = ControlChannel(engine=engine, store=ControlStore(), hub=WaiterHub())
    other = ControlChannel(engine=engine, store=ControlStore(), hub=WaiterHub())
    alone.start()
    try:
        assert await alone.wait_connected(5)
        alone.announce("q", 1)
        # Only its own hello goes out; the wake-up stays local (a raw LISTENer is no instance).
        await poll_until(lambda: bool(heard), within=5, what="the hello")
        assert all(decode_payload(p) == (alone.instance, 0, "") for p in heard)
        other.start()
        assert await other.wait_connected(5)
        await poll_until(lambda: other.instance in alone.peers, within=5, what="the newcomer")
        await poll_until(lambda: alone.instance in other.peers, within=5, what="the reply")
        heard.clear()
        alone.announce("q", 2)
        await poll_until(lambda: bool(heard), within=5, what="the wake-up")
        assert decode_payload(heard[0]) == (alone.instance, 2, "q")
    finally:
        await other.stop()
        await alone.stop()
        await listener.close()
        await engine.dispose()


async def test_wake_ups_announced_while_the_connection_is_down_go_out_when_it_is_back(
    database_url: str,
) -> None:
    heard: list[str] = []
    listener = await asyncpg.connect(database_url.replace("+asyncpg", ""))
    await listener.add_listener(CHANNEL, lambda *args: heard.append(args[-1]))
    engine = create_async_engine(async_url(database_url), poolclass=NullPool)
    control = ControlChannel(engine=engine, store=ControlStore(), hub=WaiterHub())
    control.start()
    try:
        assert await control.wait_connected(5)
        await listener.execute("SELECT pg_notify($1, 'other-instance 0 ')", CHANNEL)
        await poll_until(lambda: bool(control.peers), within=5, what="the peer to be heard")
        # Reconnecting fails until the gate opens: the channel sits in its backoff, down.
        gate = asyncio.Event()
        connect = control._connect

        async def gated() -> None:
            if not gate.is_set():
                raise OSError("the database is away")
            await connect()

        control._connect = gated  # type: ignore[method-assign]
        await listener.execute("SELECT pg_terminate_backend($1)", control._driver.get_server_pid())
        await poll_until(lambda: not control.connected, within=5, what="the connection to drop")
        control.announce("emails", 2)
        flush = control._flush_task
        assert flush is not None
        await asyncio.wait_for(flush, 5)
        assert control._pending == {"emails": 2}, "kept for the reconnect, not dropped"
        gate.set()
        assert await control.wait_connected(5)
        await poll_until(
            lambda: any(
                (d := decode_payload(p)) and d[0] == control.instance and d[1] == 2 for p in heard
            ),
            within=5,
            what="the wake-up sent after the reconnect",
        )
    finally:
        await control.stop()
        await listener.close()
        await engine.dispose()
