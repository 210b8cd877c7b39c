"""The raw-SQL baseline of the composed workloads: the application chains and counts by itself.

The same shapes, producers, workers and timing as ``bench/composed.py``, over asyncpg on the
same database and the real jobs table, without jobq's waiting state, triggers or HTTP. What an
application without workflow support would write:

- :func:`chain`: the producer inserts step a; the statement that completes a claimed step also
  inserts the next one, carrying the parent's result in its payload (one autocommit statement
  per claim: ``WITH done AS (UPDATE ...) INSERT ... SELECT FROM done``);
- :func:`fanin`: the producer inserts a counter row (``bench_fanin``: batch, remaining) and the
  batch's jobs in one statement; completing a claim's jobs of one batch decrements its counter
  in the same statement, and the statement that takes it to 0 inserts the callback.

A worker whose claim finds nothing pauses ``RAW_POLL_SECONDS`` before claiming again: raw SQL
has no long-poll (jobq's claims wait on LISTEN/NOTIFY), so each hop of a unit may add up to
that pause to its latency.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg

from bench.baseline import MAX_ATTEMPTS, close_all, connect_all
from bench.common import LEASE_SECONDS, Counter, Errors, Flows, Meter
from bench.composed import (
    CALLBACK_TYPE,
    CHAIN_STEPS,
    PART_TYPE,
    STEP_TYPE,
    UNIT_TIMEOUT_SECONDS,
    step_result,
)

RAW_POLL_SECONDS = 0.005
# Connections the producers share (each holds one only for its insert), as an application's pool
# would: the units in flight need not hold a backend each while they wait.
PRODUCER_CONNECTIONS = 4
FANIN_TABLE = "bench_fanin"

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
RETURNING j.id, j.lease_id, j.type, j.payload
"""

INSERT_STEP = """
INSERT INTO jobs (queue, type, payload, priority, status, max_attempts, lease_seconds, run_at)
VALUES ($1, $2, $3::jsonb, 0, 'pending', $4, $5, now())
RETURNING id
"""

# Completes a claim's steps and inserts each one's next step with its result, in one statement.
CHAIN_COMPLETE = """
WITH done AS (
    UPDATE jobs j
    SET status = 'succeeded', finished_at = now(), lease_ended_by = 'complete', result = u.result
    FROM unnest($1::bigint[], $2::uuid[], $3::jsonb[]) AS u(id, lease_id, result)
    WHERE j.id = u.id AND j.lease_id = u.lease_id AND j.status = 'running'
    RETURNING j.queue, j.payload, u.result
), next AS (
    INSERT INTO jobs (queue, type, payload, priority, status, max_attempts, lease_seconds, run_at)
    SELECT queue, $4,
           jsonb_build_object('workflow', payload -> 'workflow',
                              'step', CASE payload ->> 'step' WHEN 'a' THEN 'b' ELSE 'c' END,
                              'parent', result),
           0, 'pending', $5, $6, now()
    FROM done
    WHERE payload ->> 'step' <> 'c'
    RETURNING id
)
SELECT (SELECT count(*) FROM done) AS completed, (SELECT count(*) FROM next) AS inserted
"""

FANIN_TABLE_CREATE = f"""
CREATE TABLE IF NOT EXISTS {FANIN_TABLE} (batch bigint PRIMARY KEY, remaining int NOT NULL)
"""

# The batch's counter and its jobs, in one statement.
FANIN_INSERT = f"""
WITH counter AS (INSERT INTO {FANIN_TABLE} (batch, remaining) VALUES ($1, $2))
INSERT INTO jobs (queue, type, payload, priority, status, max_attempts, lease_seconds, run_at)
SELECT $3, $4, jsonb_build_object('batch', $1::bigint, 'i', i), 0, 'pending', $5, $6, now()
FROM generate_series(0, $2 - 1) AS i
RETURNING id
"""

# Completes a claim's jobs of one batch, counts them off, and inserts the callback at 0.
FANIN_COMPLETE = f"""
WITH done AS (
    UPDATE jobs SET status = 'succeeded', finished_at = now(), lease_ended_by = 'complete'
    WHERE id = ANY($1::bigint[]) AND lease_id = ANY($2::uuid[]) AND status = 'running'
    RETURNING id
), counted AS (
    UPDATE {FANIN_TABLE} SET remaining = remaining - (SELECT count(*) FROM done)
    WHERE batch = $3
    RETURNING remaining
), callback AS (
    INSERT INTO jobs (queue, type, payload, priority, status, max_attempts, lease_seconds, run_at)
    SELECT $4, $5, jsonb_build_object('batch', $3::bigint), 0, 'pending', $6, $7, now()
    FROM counted
    WHERE remaining = 0
    RETURNING id
)
SELECT (SELECT count(*) FROM done) AS completed, (SELECT count(*) FROM callback) AS callbacks
"""

COMPLETE = """
UPDATE jobs SET status = 'succeeded', finished_at = now(), lease_ended_by = 'complete'
WHERE id = ANY($1) AND lease_id = ANY($2) AND status = 'running'
"""

# Given a worker's connection and its claimed rows: completes them (answering how many
# statements it sent and the ids it completed) and ends the units they finish.
CompleteClaim = Callable[[Any, list[Any], Flows, list[Any]], Awaitable[tuple[int, list[int]]]]


async def run_units(
    args: dict[str, Any],
    meter: Meter,
    errors: Errors,
    *,
    send: Callable[[Any, int], Awaitable[bool]],
    complete: CompleteClaim,
) -> dict[str, Any]:
    """Keeps ``in_flight`` units going (unit ``n`` is keyed ``n``; the producers share
    ``PRODUCER_CONNECTIONS`` connections) while ``workers`` connections claim and complete;
    answers the latencies and what was completed."""
    queue, units, max_jobs = args["queue"], int(args["units"]), int(args["max_jobs"])
    numbers = Counter(units)
    flows = Flows()
    in_flight = int(args["in_flight"])
    producers = await connect_all(args["dsn"], min(in_flight, PRODUCER_CONNECTIONS))
    idle: asyncio.Queue[Any] = asyncio.Queue()
    for conn in producers:
        idle.put_nowait(conn)
    workers = await connect_all(args["dsn"], int(args["workers"]))
    latencies: list[float] = []
    completed: list[int] = []
    ended: list[Any] = []
    requests = 0

    async def producer() -> None:
        nonlocal requests
        while chunk := numbers.take(1):
            n = chunk[0]
            sent = time.perf_counter()
            requests += 1
            conn = await idle.get()
            try:
                if not await send(conn, n):
                    continue
            except asyncpg.PostgresError as exc:
                errors.add(f"insert of unit {n}: {exc!r}")
                continue
            finally:
                idle.put_nowait(conn)
            try:
                at = await flows.ended(n, UNIT_TIMEOUT_SECONDS)
            except TimeoutError:
                errors.add(f"unit {n} not ended {UNIT_TIMEOUT_SECONDS:g} s after it was sent")
                continue
            latencies.append((at - sent) * 1000)

    async def worker(index: int, conn: Any) -> None:
        nonlocal requests
        worker_id = f"bench-raw-composed-{index}"
        while True:
            requests += 1
            try:
                rows = await conn.fetch(CLAIM, queue, max_jobs, worker_id)
            except asyncpg.PostgresError as exc:
                errors.add(f"claim: {exc!r}")
                await asyncio.sleep(0.1)
                continue
            if not rows:
                await asyncio.sleep(RAW_POLL_SECONDS)
                continue
            try:
                statements, ids = await complete(conn, list(rows), flows, ended)
            except asyncpg.PostgresError as exc:
                errors.add(f"complete: {exc!r}")
                continue
            requests += statements
            completed.extend(ids)

    await asyncio.gather(*(conn.fetchval("SELECT 1") for conn in [*producers, *workers]))
    meter.start()
    tasks = [asyncio.create_task(worker(i, conn)) for i, conn in enumerate(workers)]
    await asyncio.gather(*(producer() for _ in range(in_flight)))
    meter.stop()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await close_all([*producers, *workers])
    return {
        "units": numbers.next,
        "jobs": len(completed),
        "requests": requests,
        "latencies_ms": latencies,
        "completed_ids": completed,
        "ended": ended,
    }


def end(flows: Flows, ended: list[Any], key: Any, errors: Errors) -> None:
    """Ends unit ``key`` (a duplicate end is an error)."""
    if not flows.end(key):
        errors.add(f"unit {key} ended twice")
    ended.append(key)


async def chain(args: dict[str, Any], meter: Meter, errors: Errors) -> dict[str, Any]:
    """``units`` chains a -> b -> c, each next step inserted by the statement completing its parent."""
    queue = args["queue"]

    async def send(conn: Any, n: int) -> bool:
        body = json.dumps({"workflow": n, "step": CHAIN_STEPS[0]})
        await conn.fetchval(INSERT_STEP, queue, STEP_TYPE, body, MAX_ATTEMPTS, LEASE_SECONDS)
        return True

    async def complete(
        conn: Any, rows: list[Any], flows: Flows, ended: list[Any]
    ) -> tuple[int, list[int]]:
        results, finishing = [], []
        for row in rows:
            payload = json.loads(row["payload"])
            workflow, step = payload["workflow"], payload["step"]
            index = CHAIN_STEPS.index(step)
            if index > 0 and payload.get("parent") != step_result(workflow, CHAIN_STEPS[index - 1]):
                errors.add(f"step {step} of chain {workflow} got {payload.get('parent')!r}")
            results.append(json.dumps(step_result(workflow, step)))
            if index == len(CHAIN_STEPS) - 1:
                finishing.append(workflow)
        ids = [row["id"] for row in rows]
        answer = await conn.fetchrow(
            CHAIN_COMPLETE,
            ids,
            [row["lease_id"] for row in rows],
            results,
            STEP_TYPE,
            MAX_ATTEMPTS,
            LEASE_SECONDS,
        )
        if answer["completed"] != len(ids) or answer["inserted"] != len(ids) - len(finishing):
            errors.add(f"chain complete of {len(ids)} steps answered {dict(answer)}")
        for workflow in finishing:
            end(flows, ended, workflow, errors)
        return 1, ids

    return await run_units(args, meter, errors, send=send, complete=complete)


async def fanin(args: dict[str, Any], meter: Meter, errors: Errors) -> dict[str, Any]:
    """``units`` batches of ``fan`` jobs, each counted off as its jobs complete; the last count
    inserts the batch's callback."""
    queue, fan = args["queue"], int(args["fan"])
    setup = await asyncpg.connect(args["dsn"])
    try:
        await setup.execute(FANIN_TABLE_CREATE)
        await setup.execute(f"TRUNCATE {FANIN_TABLE}")
    finally:
        await setup.close()

    async def send(conn: Any, n: int) -> bool:
        rows = await conn.fetch(FANIN_INSERT, n, fan, queue, PART_TYPE, MAX_ATTEMPTS, LEASE_SECONDS)
        if len(rows) != fan:
            errors.add(f"batch {n}: {len(rows)} jobs inserted, not {fan}")
            return False
        return True

    async def complete(
        conn: Any, rows: list[Any], flows: Flows, ended: list[Any]
    ) -> tuple[int, list[int]]:
        by_batch: dict[int, list[Any]] = {}
        callbacks: list[Any] = []
        for row in rows:
            if row["type"] == CALLBACK_TYPE:
                callbacks.append(row)
            else:
                by_batch.setdefault(json.loads(row["payload"])["batch"], []).append(row)
        statements, ids = 0, []
        for batch, parts in sorted(by_batch.items()):
            part_ids = [row["id"] for row in parts]
            answer = await conn.fetchrow(
                FANIN_COMPLETE,
                part_ids,
                [row["lease_id"] for row in parts],
                batch,
                queue,
                CALLBACK_TYPE,
                MAX_ATTEMPTS,
                LEASE_SECONDS,
            )
            statements += 1
            if answer["completed"] != len(part_ids):
                errors.add(f"fan-in complete of {len(part_ids)} jobs answered {dict(answer)}")
            ids.extend(part_ids)
        if callbacks:
            callback_ids = [row["id"] for row in callbacks]
            status = await conn.execute(
                COMPLETE, callback_ids, [row["lease_id"] for row in callbacks]
            )
            statements += 1
            if status != f"UPDATE {len(callback_ids)}":
                errors.add(f"complete of {len(callback_ids)} callbacks answered {status!r}")
            ids.extend(callback_ids)
            for row in callbacks:
                end(flows, ended, json.loads(row["payload"])["batch"], errors)
        return statements, ids

    return await run_units(args, meter, errors, send=send, complete=complete)
