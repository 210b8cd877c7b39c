"""The lean raw-SQL queue of ``python -m bench.rate``: its table, its statements, its workers.

A queue table of its own, in a database of its own (``bench/rate_systems.py`` makes it), holding
what a queue with leases needs and no more: id, queue, payload, priority, status, attempts,
run_at, lease_id, lease_expires_at, with one partial index over the claimable rows in claim
order. Producers ``INSERT``; each worker is one asyncpg connection that claims one row
(``WITH picked AS (SELECT ... FOR UPDATE SKIP LOCKED LIMIT 1) UPDATE ... RETURNING``), works,
and completes it with an ``UPDATE`` checked against its lease.

Waiting is LISTEN/NOTIFY: a statement trigger notifies once per insert (sent when it commits);
one listening connection wakes one idle worker per notification, longest idle first. A worker
claims again straight after a job and waits only after an empty claim; it registers as idle
before that claim, so an insert committed after the claim's snapshot still wakes someone, and a
worker woken while its claim found a job hands the wake-up on. After 1 s without one it looks
again anyway.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import asyncpg

from bench.common import LEASE_SECONDS, Errors
from bench.rate_targets import (
    FALLBACK_POLL_SECONDS,
    PRODUCERS_MAX_SQL,
    RETRY_SECONDS,
    WORK_SECONDS,
    Recorder,
    connect,
    number,
    stop_all,
)

LEAN_TABLE = "lean_jobs"
LEAN_CHANNEL = "lean_jobs"
# The lean queue: what a queue needs and no more. The partial index holds only claimable rows,
# in claim order; the statement trigger announces every insert once, after it commits.
LEAN_SCHEMA = f"""
CREATE TABLE {LEAN_TABLE} (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue text NOT NULL,
    payload jsonb NOT NULL,
    priority smallint NOT NULL DEFAULT 0,
    status text NOT NULL DEFAULT 'pending',
    attempts integer NOT NULL DEFAULT 0,
    run_at timestamptz NOT NULL DEFAULT now(),
    lease_id uuid,
    lease_expires_at timestamptz
);
CREATE INDEX {LEAN_TABLE}_claim ON {LEAN_TABLE} (queue, priority DESC, run_at, id)
    WHERE status = 'pending';
CREATE FUNCTION {LEAN_TABLE}_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('{LEAN_CHANNEL}', '');
    RETURN NULL;
END
$$;
CREATE TRIGGER {LEAN_TABLE}_notify AFTER INSERT ON {LEAN_TABLE}
    FOR EACH STATEMENT EXECUTE FUNCTION {LEAN_TABLE}_notify();
"""
LEAN_INSERT = f"INSERT INTO {LEAN_TABLE} (queue, payload) VALUES ($1, $2::jsonb) RETURNING id"
LEAN_CLAIM = f"""
WITH picked AS (
    SELECT id FROM {LEAN_TABLE}
    WHERE queue = $1 AND status = 'pending' AND run_at <= now()
    ORDER BY priority DESC, run_at, id
    LIMIT 1
    FOR UPDATE SKIP LOCKED
)
UPDATE {LEAN_TABLE} j
SET status = 'running', attempts = j.attempts + 1, lease_id = gen_random_uuid(),
    lease_expires_at = now() + make_interval(secs => $2)
FROM picked
WHERE j.id = picked.id
RETURNING j.id, j.lease_id, j.payload
"""
LEAN_COMPLETE = f"""
UPDATE {LEAN_TABLE} SET status = 'done', lease_id = NULL, lease_expires_at = NULL
WHERE id = $1 AND lease_id = $2 AND status = 'running'
"""


class Waker:
    """Idle lean workers, woken one per notification, longest idle first."""

    def __init__(self) -> None:
        self.idle: collections.deque[asyncio.Event] = collections.deque()

    def park(self, event: asyncio.Event) -> None:
        """Registers a worker as idle (before its claim, so no later insert is missed)."""
        event.clear()
        if event not in self.idle:
            self.idle.append(event)

    def unpark(self, event: asyncio.Event) -> None:
        """A worker found a job: no longer idle."""
        with contextlib.suppress(ValueError):
            self.idle.remove(event)

    def wake_one(self, *_: Any) -> None:
        """Wakes the longest-idle worker (a LISTEN callback: connection, pid, channel, payload)."""
        if self.idle:
            self.idle.popleft().set()


class LeanTarget:
    """The lean raw-SQL queue: INSERT; claim with SKIP LOCKED, then UPDATE; LISTEN/NOTIFY wakes."""

    producers_max = PRODUCERS_MAX_SQL

    def __init__(self, args: dict[str, Any], errors: Errors) -> None:
        self.dsn: str = args["dsn"]
        self.queue: str = args["queue"]
        self.errors = errors

    async def open_producer(self, *, patient: bool = False) -> Any:
        """An asyncpg connection."""
        return await connect(self.dsn, "lean", patient=patient)

    async def close_producer(self, producer: Any) -> None:
        """Closes the connection."""
        await producer.close()

    async def enqueue(self, producer: Any, n: int) -> int | None:
        """One autocommit ``INSERT`` (its trigger notifies)."""
        try:
            job_id: int = await producer.fetchval(LEAN_INSERT, self.queue, json.dumps({"n": n}))
        except (asyncpg.PostgresError, OSError) as exc:
            self.errors.add(f"insert: {exc!r}")
            return None
        return job_id

    @contextlib.asynccontextmanager
    async def workers(self, count: int, recorder: Recorder) -> AsyncIterator[None]:
        """``count`` workers on a connection each, and one listening connection waking them."""
        listener = await connect(self.dsn, "lean-listen", patient=True)
        conns = list(
            await asyncio.gather(*(connect(self.dsn, "lean", patient=True) for _ in range(count)))
        )
        waker = Waker()
        await listener.add_listener(LEAN_CHANNEL, waker.wake_one)
        tasks = [asyncio.create_task(self._work(c, waker, recorder)) for c in conns]
        try:
            yield
        finally:
            await stop_all(tasks)
            await asyncio.gather(*(conn.close() for conn in [listener, *conns]))

    async def _work(self, conn: Any, waker: Waker, recorder: Recorder) -> None:
        event = asyncio.Event()
        while True:
            waker.park(event)
            try:
                row = await conn.fetchrow(LEAN_CLAIM, self.queue, float(LEASE_SECONDS))
            except (asyncpg.PostgresError, OSError) as exc:
                self.errors.add(f"claim: {exc!r}")
                await asyncio.sleep(RETRY_SECONDS)
                continue
            if row is None:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(event.wait(), FALLBACK_POLL_SECONDS)
                continue
            waker.unpark(event)
            if event.is_set():  # woken while it claimed: hand the wake-up on to an idle worker
                waker.wake_one()
            recorder.start(number(row["payload"]))
            await asyncio.sleep(WORK_SECONDS)
            try:
                status = await conn.execute(LEAN_COMPLETE, row["id"], row["lease_id"])
            except (asyncpg.PostgresError, OSError) as exc:
                self.errors.add(f"complete: {exc!r}")
                continue
            if status == "UPDATE 1":
                recorder.finish(row["id"])
            else:
                self.errors.add(f"complete of job {row['id']} answered {status!r}")
