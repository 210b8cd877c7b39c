"""The raw-SQL baseline the load process (``python -m bench.load raw-...``) runs straight on PostgreSQL.

The same workloads as ``bench/workloads.py``, with one asyncpg connection per simulated client
and one autocommit statement per step:

- :func:`enqueue`: a single-row ``INSERT`` of the columns jobq sets (queue, type, payload,
  priority, status, max_attempts, lease_seconds, run_at), or a 500-row ``INSERT ... SELECT FROM
  unnest(...)``;
- :func:`drain`: claim (``WITH picked AS (... FOR UPDATE SKIP LOCKED) UPDATE ... RETURNING``)
  then complete (``UPDATE ... WHERE id = ANY(...) AND lease_id = ANY(...)``) until empty.

``python -m bench`` runs these statements twice per row, against two ``jobs`` tables: jobq's own
(on the jobq database, where the schema's statement-level triggers, per-queue counters and
indexes fire for them as they do for jobq), and the lean queue table of ``bench/lean.py`` (in a
database of its own: the same columns these statements touch, a primary key, one partial claim
index, no triggers). What both leave out is HTTP, validation, JSON and the Python service; what
the second also leaves out is the schema. :func:`insert_batches` is the drains' untimed pre-load,
the same 500-row statement run by the orchestrator on its own connection.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import asyncpg

from bench.common import JOB_TYPE, LEASE_SECONDS, Counter, Errors, Meter

APPLICATION_NAME = "bench-raw"
MAX_ATTEMPTS = 10

INSERT_ONE = """
INSERT INTO jobs (queue, type, payload, priority, status, max_attempts, lease_seconds, run_at)
VALUES ($1, $2, $3::jsonb, 0, 'pending', $4, $5, now())
RETURNING id
"""

INSERT_MANY = """
INSERT INTO jobs (queue, type, payload, priority, status, max_attempts, lease_seconds, run_at)
SELECT $1, $2, p, 0, 'pending', $4, $5, now()
FROM unnest($3::jsonb[]) AS t(p)
RETURNING id
"""

CLAIM = """
WITH picked AS (
    SELECT id FROM jobs
    WHERE queue = $1 AND status = 'pending'
    ORDER BY priority DESC, run_at, id
    LIMIT $2
    FOR UPDATE SKIP LOCKED
)
UPDATE jobs j
SET status = 'running', attempts = attempts + 1, lease_id = gen_random_uuid(), worker_id = $3,
    lease_expires_at = now() + interval '30 s', started_at = now()
FROM picked
WHERE j.id = picked.id
RETURNING j.id, j.lease_id
"""

COMPLETE = """
UPDATE jobs SET status = 'succeeded', finished_at = now(), lease_ended_by = 'complete'
WHERE id = ANY($1) AND lease_id = ANY($2) AND status = 'running'
"""


async def connect_all(dsn: str, n: int, name: str = APPLICATION_NAME) -> list[Any]:
    """``n`` asyncpg connections, named ``name`` (default ``bench-raw``) in ``pg_stat_activity``."""
    return list(
        await asyncio.gather(
            *(asyncpg.connect(dsn, server_settings={"application_name": name}) for _ in range(n))
        )
    )


async def close_all(conns: list[Any]) -> None:
    """Closes every connection."""
    await asyncio.gather(*(conn.close() for conn in conns))


def payload(n: int) -> str:
    """The payload of job number ``n`` as JSON text, the same as the HTTP workloads send."""
    return json.dumps({"n": n})


async def enqueue(args: dict[str, Any], meter: Meter, errors: Errors) -> dict[str, Any]:
    """Inserts ``jobs`` jobs from ``clients`` connections, ``batch`` rows per statement."""
    queue, batch = args["queue"], int(args["batch"])
    numbers = Counter(int(args["jobs"]))
    conns = await connect_all(args["dsn"], int(args["clients"]))
    created: list[int] = []
    requests = 0

    async def client(conn: Any) -> None:
        nonlocal requests
        while chunk := numbers.take(batch):
            requests += 1
            try:
                if batch == 1:
                    created.append(
                        await conn.fetchval(
                            INSERT_ONE,
                            queue,
                            JOB_TYPE,
                            payload(chunk[0]),
                            MAX_ATTEMPTS,
                            LEASE_SECONDS,
                        )
                    )
                else:
                    rows = await conn.fetch(
                        INSERT_MANY,
                        queue,
                        JOB_TYPE,
                        [payload(n) for n in chunk],
                        MAX_ATTEMPTS,
                        LEASE_SECONDS,
                    )
                    created.extend(row["id"] for row in rows)
            except asyncpg.PostgresError as exc:
                errors.add(f"insert: {exc!r}")

    # One round trip on each connection first: the timed section starts with all of them ready.
    await asyncio.gather(*(conn.fetchval("SELECT 1") for conn in conns))
    meter.start()
    await asyncio.gather(*(client(conn) for conn in conns))
    meter.stop()
    await close_all(conns)
    return {
        "jobs": numbers.next,
        "requests": requests,
        "statements": requests,  # one statement a request
        "created": len(created),
        "created_unique": len(set(created)),
    }


async def drain(args: dict[str, Any], meter: Meter, errors: Errors) -> dict[str, Any]:
    """``workers`` connections loop claim (``max_jobs``) then complete until a claim finds nothing."""
    queue, max_jobs = args["queue"], int(args["max_jobs"])
    conns = await connect_all(args["dsn"], int(args["workers"]))
    completed: list[int] = []
    requests = 0

    async def worker(index: int, conn: Any) -> None:
        nonlocal requests
        worker_id = f"bench-raw-{index}"
        while True:
            requests += 1
            try:
                rows = await conn.fetch(CLAIM, queue, max_jobs, worker_id)
            except asyncpg.PostgresError as exc:
                errors.add(f"claim: {exc!r}")
                return
            if not rows:
                return
            ids = [row["id"] for row in rows]
            requests += 1
            try:
                status = await conn.execute(COMPLETE, ids, [row["lease_id"] for row in rows])
            except asyncpg.PostgresError as exc:
                errors.add(f"complete: {exc!r}")
                return
            if status != f"UPDATE {len(ids)}":
                errors.add(f"complete of {len(ids)} leases answered {status!r}")
                return
            completed.extend(ids)

    await asyncio.gather(*(conn.fetchval("SELECT 1") for conn in conns))
    meter.start()
    await asyncio.gather(*(worker(i, conn) for i, conn in enumerate(conns)))
    meter.stop()
    await close_all(conns)
    return {
        "jobs": len(completed),
        "requests": requests,
        "statements": requests,  # one statement a request
        "completed_ids": completed,
    }


async def insert_batches(conn: Any, *, queue: str, jobs: int, batch: int) -> dict[str, Any]:
    """Inserts ``jobs`` jobs on ``conn`` through :data:`INSERT_MANY`, ``batch`` rows a statement.

    A drain's pre-load, untimed: the rows :func:`enqueue` would insert, without starting a load
    process for them. Answers what :func:`enqueue` answers, errors included.
    """
    numbers, errors = Counter(jobs), Errors()
    created: list[int] = []
    while chunk := numbers.take(batch):
        try:
            rows = await conn.fetch(
                INSERT_MANY,
                queue,
                JOB_TYPE,
                [payload(n) for n in chunk],
                MAX_ATTEMPTS,
                LEASE_SECONDS,
            )
        except asyncpg.PostgresError as exc:
            errors.add(f"insert: {exc!r}")
            continue
        created.extend(row["id"] for row in rows)
    return {
        "jobs": numbers.next,
        "created": len(created),
        "created_unique": len(set(created)),
        **errors.figures(),
    }
