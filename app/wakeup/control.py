"""The instance's one connection outside the pool: LISTEN for wake-ups, coalesced NOTIFY, leader lock.

Enqueue transactions never NOTIFY: a transaction that notifies takes a global lock while it
commits, which serialises the commits (fsync included) of every notifying transaction. Instead
the service wakes its own waiters in-process right after commit and hands the queue to
:meth:`ControlChannel.announce`, which sends one ``pg_notify`` per queue per short window from
this connection, in a transaction that writes no WAL. Other instances LISTEN here and wake their
waiters; our own notifications are recognised by the instance id and ignored.

The connection also listens on other channels for whoever asks (``listeners``: the key ring
reloads on ``jobq_keys``, parked job reads wake on ``jobq_finished``); each callback gets every
notification's payload, and ``None`` after each (re)connect, since notifications sent while
the connection was down are lost. A callback that does not need the payload is wrapped with
:func:`ignoring_payload`.

A notification takes a transaction id and a round trip, so an instance that knows of no other
sends none. Instances say hello on the channel when they connect, answer a newcomer's hello at
once, and repeat it as their keep-alive every few seconds; one that has been silent for three
of those is taken to be gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from app.errors import brief
from app.queue.waiters import WaiterHub
from app.settings import setting_default
from app.store.conn import DriverConn, EngineConn
from app.store.control import ControlStore

logger = logging.getLogger("jobq.wakeup")

CHANNEL = "jobq_wakeup"
# The sender jobq.enqueue() (app/store/sql/schema/enqueue.sql) signs its wake-ups with: no instance id looks so.
SQL_PRODUCER = "sql"
COALESCE_WINDOW_SECONDS_DEFAULT: float = setting_default("notify_coalesce_seconds")
RECONNECT_MIN_SECONDS = 0.1
RECONNECT_MAX_SECONDS = 5.0
PING_INTERVAL_SECONDS = 5.0
# A peer not heard from for this long is gone (it says hello every PING_INTERVAL_SECONDS).
PEER_SILENCE_SECONDS = 3 * PING_INTERVAL_SECONDS
HELLO = 0  # the count of a hello: no jobs, just "I am here"
STOP_FLUSH_WAIT_SECONDS = 1.0


def encode_payload(instance: str, queue: str, count: int) -> str:
    """``<instance> <count> <queue>``: small, and the queue (which may hold ':') comes last."""
    return f"{instance} {count} {queue}"


def decode_payload(payload: str) -> tuple[str, int, str] | None:
    """The parts of a payload, or ``None`` for one this version does not understand."""
    parts = payload.split(" ", 2)
    if len(parts) != 3 or not parts[1].isdigit():
        return None
    return parts[0], int(parts[1]), parts[2]


Listener = Callable[[str | None], object]
"""Called with each notification's payload on its channel, and with ``None`` after a (re)connect."""


def ignoring_payload(callback: Callable[[], object]) -> Listener:
    """A listener that calls ``callback`` whatever the payload (for "something changed" channels)."""

    def listener(_payload: str | None) -> object:
        return callback()

    return listener


class ControlChannel:
    """Owns the control connection: listens, announces, elects; reconnects with backoff when lost."""

    def __init__(
        self,
        *,
        engine: AsyncEngine,
        store: ControlStore,
        hub: WaiterHub,
        coalesce_window: float = COALESCE_WINDOW_SECONDS_DEFAULT,
        listeners: Mapping[str, Listener] | None = None,
    ) -> None:
        self.engine = engine
        self.listeners = dict(listeners or {})
        self.store = store
        self.hub = hub
        self.coalesce_window = coalesce_window
        self.instance = uuid.uuid4().hex[:12]
        self._conn: AsyncConnection | None = None
        # The same connection's asyncpg side: notifications go out on it directly (they are
        # frequent under load; SQLAlchemy's per-call cost showed in the profile).
        self._driver: Any = None
        self._io = asyncio.Lock()  # one statement at a time on the one connection
        self._lost = asyncio.Event()
        self._connected = asyncio.Event()
        self._holds_lock = False
        self._pending: dict[str, int] = {}
        self._flush_task: asyncio.Task[None] | None = None
        self._task: asyncio.Task[None] | None = None
        self._peers: dict[str, float] = {}  # other instances' ids -> when last heard
        self._replies: set[asyncio.Task[None]] = set()

    @property
    def connected(self) -> bool:
        """Whether the control connection is up (and listening)."""
        return self._connected.is_set()

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        """Starts the supervised task that keeps the connection up."""
        self._task = asyncio.create_task(self._keep_connected(), name="jobq-control")

    async def wait_connected(self, seconds: float) -> bool:
        """Waits until the connection is up; answers whether it is."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self._connected.wait()
        return self.connected

    async def stop(self) -> None:
        """Sends what is buffered, then closes the connection (which frees the leader lock)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        flush = self._flush_task
        if flush is not None and not flush.done():
            # Let a send in flight finish rather than cut it off mid-statement; a flush that
            # cannot finish in time is cancelled and puts its wake-ups back for the send below.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(flush), STOP_FLUSH_WAIT_SECONDS)
            flush.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await flush
        if self._pending:
            await self._flush()
        await self._close()

    # -- announcing --------------------------------------------------------------------------

    def announce(self, queue: str, count: int = 1) -> None:
        """Jobs became claimable in ``queue``: wake local waiters now, other instances shortly."""
        if count <= 0:
            return
        self.hub.notify(queue, count)
        if not self.peers:
            return  # nobody else listens: no notification, no transaction
        self._pending[queue] = self._pending.get(queue, 0) + count
        # Leading edge: the first announcement goes out at once; those that arrive while it is
        # being sent, or within the window after it, go out together in the next one.
        self._flush_soon()

    async def _flush_then_hold(self) -> None:
        # While the connection is down the wake-ups wait in _pending; the reconnect sends them.
        while self._pending and self._conn is not None:
            await self._flush()
            await asyncio.sleep(self.coalesce_window)

    def _flush_soon(self) -> None:
        if self._pending and (self._flush_task is None or self._flush_task.done()):
            self._flush_task = asyncio.create_task(self._flush_then_hold(), name="jobq-notify")

    async def _flush(self) -> None:
        pending, self._pending = self._pending, {}
        payloads = [encode_payload(self.instance, q, n) for q, n in pending.items()]
        sent = False
        try:
            async with self._io:
                if self._conn is None:
                    # Down: kept for the reconnect (dropping them left a claim parked on another
                    # instance until its backstop, which backs off while the database is away).
                    return
                try:
                    await self.store.wakeup_notify(
                        DriverConn(self._driver), channel=CHANNEL, payloads=payloads
                    )
                except Exception as exc:  # noqa: BLE001 - any failure: reconnect, never die
                    logger.warning("notify failed: %s", brief(exc))
                    self._lost.set()
                sent = True
        finally:
            if not sent:
                # Cancelled while waiting for the connection or mid-send (shutdown): keep the
                # wake-ups, so stop() still sends them.
                for queue, count in pending.items():
                    self._pending[queue] = self._pending.get(queue, 0) + count

    # -- leadership --------------------------------------------------------------------------

    async def lead(self) -> bool:
        """Whether this instance holds the maintenance leader lock, taking it if it is free."""
        async with self._io:
            if self._conn is None:
                return False
            if self._holds_lock:
                return True
            try:
                self._holds_lock = await self.store.maintenance_try_lead(EngineConn(self._conn))
            except Exception as exc:  # noqa: BLE001 - any failure: reconnect, never die
                logger.warning("leader election failed: %s", brief(exc))
                self._lost.set()
                return False
            if self._holds_lock:
                logger.info("instance %s now runs maintenance", self.instance)
            return self._holds_lock

    # -- the connection ----------------------------------------------------------------------

    @property
    def peers(self) -> list[str]:
        """The other instances heard from lately."""
        now = asyncio.get_running_loop().time()
        return [p for p, seen in self._peers.items() if now - seen < PEER_SILENCE_SECONDS]

    def _on_notification(self, _conn: Any, _pid: int, _channel: str, payload: str) -> None:
        decoded = decode_payload(payload)
        if decoded is None:
            return
        sender, count, queue = decoded
        if sender == self.instance:
            return
        if sender == SQL_PRODUCER:
            # jobq.enqueue() in a producer's committed transaction: a wake-up, not an instance.
            self.hub.notify(queue, count)
            return
        newcomer = sender not in self.peers
        self._peers[sender] = asyncio.get_running_loop().time()
        if count == HELLO:
            if newcomer:
                # Answer at once, so the newcomer knows of us before its next keep-alive.
                reply = asyncio.get_running_loop().create_task(self._hello(), name="jobq-hello")
                self._replies.add(reply)
                reply.add_done_callback(self._replies.discard)
            return
        self.hub.notify(queue, count)

    def _on_termination(self, _conn: Any) -> None:
        self._lost.set()

    async def _connect(self) -> None:
        conn = await self.engine.connect()
        conn = await conn.execution_options(isolation_level="AUTOCOMMIT")
        raw = await conn.get_raw_connection()
        driver: Any = raw.driver_connection
        await driver.add_listener(CHANNEL, self._on_notification)
        for channel, callback in self.listeners.items():
            await driver.add_listener(channel, _calling(callback))
        driver.add_termination_listener(self._on_termination)
        self._conn = conn
        self._driver = driver

    async def _close(self) -> None:
        self._connected.clear()
        self._holds_lock = False
        conn, self._conn, self._driver = self._conn, None, None
        if conn is not None:
            with contextlib.suppress(DBAPIError, OSError):
                await conn.invalidate()
            with contextlib.suppress(DBAPIError, OSError):
                await conn.close()

    async def _hello(self) -> None:
        """Says hello on the channel; doubles as the keep-alive of the connection."""
        async with self._io:
            if self._driver is None:
                return
            try:
                await self.store.wakeup_notify(
                    DriverConn(self._driver),
                    channel=CHANNEL,
                    payloads=[encode_payload(self.instance, "", HELLO)],
                )
            except Exception as exc:  # noqa: BLE001 - any failure: reconnect, never die
                logger.warning("control connection lost: %s", brief(exc))
                self._lost.set()

    async def _keep_connected(self) -> None:
        delay = RECONNECT_MIN_SECONDS
        first = True
        while True:
            try:
                async with self._io:
                    await self._connect()
            except Exception as exc:  # noqa: BLE001 - any failure: retry with backoff, never die
                logger.warning(
                    "control connection failed: %s; retrying in %.1fs", brief(exc), delay
                )
                await asyncio.sleep(delay * random.uniform(0.8, 1.2))
                delay = min(delay * 2, RECONNECT_MAX_SECONDS)
                continue
            delay = RECONNECT_MIN_SECONDS
            self._lost.clear()
            self._connected.set()
            for callback in self.listeners.values():
                callback(None)  # whatever changed while we were not listening
            await self._hello()  # other instances learn of us, and answer so we learn of them
            self._flush_soon()  # wake-ups announced while the connection was down
            if not first:
                # Notifications may have been missed while we were away: nobody sleeps through.
                logger.info("control connection restored; waking every waiter")
                self.hub.notify_all()
            first = False
            while not self._lost.is_set():
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(PING_INTERVAL_SECONDS):
                        await self._lost.wait()
                if not self._lost.is_set():
                    await self._hello()
            async with self._io:
                await self._close()
            self.hub.notify_all()


def _calling(callback: Listener) -> Callable[[Any, int, str, str], None]:
    """An asyncpg notification listener that hands the payload to ``callback``."""

    def listener(_conn: Any, _pid: int, _channel: str, payload: str) -> None:
        callback(payload)

    return listener
