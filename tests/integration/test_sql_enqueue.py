"""jobq.enqueue(): a producer sharing the database enqueues inside its own transaction.

The job exists if and only if the producer's transaction commits: tested by commit, rollback and
a producer process killed (SIGKILL) between its business write and its commit. The function
validates as the API does, and a role granted only ``jobq_producer`` can call it and nothing
else.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import uuid
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

ORDERS = "CREATE TABLE IF NOT EXISTS shop_orders (id bigint PRIMARY KEY, total numeric NOT NULL)"


@pytest.fixture
async def conn(database_url: str, clean_db: AsyncEngine) -> AsyncIterator[asyncpg.Connection]:
    """A producer's own connection, with its own business table."""
    connection = await asyncpg.connect(database_url)
    await connection.execute(ORDERS)
    await connection.execute("TRUNCATE shop_orders")
    try:
        yield connection
    finally:
        await connection.close()


async def _jobs(conn: asyncpg.Connection) -> list[dict[str, Any]]:
    rows = await conn.fetch("SELECT * FROM jobs ORDER BY id")
    return [dict(r) for r in rows]


async def test_a_committed_transaction_holds_both_the_order_and_its_job(
    conn: asyncpg.Connection,
) -> None:
    async with conn.transaction():
        await conn.execute("INSERT INTO shop_orders VALUES (1, 99.5)")
        job_id = await conn.fetchval(
            "SELECT jobq.enqueue('emails', 'receipt', $1::jsonb, concurrency_key => 'customer:7')",
            json.dumps({"order": 1}),
        )
    [job] = await _jobs(conn)
    assert job["id"] == job_id and job["status"] == "pending"
    assert (job["queue"], job["type"], json.loads(job["payload"])) == (
        "emails",
        "receipt",
        {"order": 1},
    )
    # The API's defaults, as the instance published them (the migration's until one starts).
    assert job["max_attempts"] >= 1 and job["lease_seconds"] >= 1
    assert job["concurrency_key"] == "customer:7"
    assert await conn.fetchval("SELECT count(*) FROM shop_orders") == 1
    # The queue counters see it as they see an API enqueue.
    pending = await conn.fetchval(
        "SELECT sum(jobs) FROM queue_counts WHERE queue = 'emails' AND status = 'pending'"
    )
    assert pending == 1


async def test_a_rolled_back_transaction_leaves_neither_and_wakes_nobody(
    conn: asyncpg.Connection, database_url: str
) -> None:
    listener = await asyncpg.connect(database_url)
    heard: asyncio.Queue[str] = asyncio.Queue()
    await listener.add_listener("jobq_wakeup", lambda *args: heard.put_nowait(args[3]))
    try:
        with pytest.raises(RuntimeError):
            async with conn.transaction():
                await conn.execute("INSERT INTO shop_orders VALUES (2, 10)")
                await conn.fetchval("SELECT jobq.enqueue('emails', 'receipt')")
                raise RuntimeError("the business write failed later")
        assert await _jobs(conn) == []
        assert await conn.fetchval("SELECT count(*) FROM shop_orders") == 0
        # A committed one afterwards: notifications arrive in commit order, so the first heard
        # is this one's if the rolled-back call sent none.
        async with conn.transaction():
            await conn.fetchval("SELECT jobq.enqueue('sentinel', 'ping')")
        assert await asyncio.wait_for(heard.get(), timeout=10) == "sql 1 sentinel"
        # A job due later wakes nobody either; nor does wake => false.
        async with conn.transaction():
            await conn.fetchval("SELECT jobq.enqueue('later', 't', delay_seconds => 3600)")
            await conn.fetchval("SELECT jobq.enqueue('quiet', 't', wake => false)")
            await conn.fetchval("SELECT jobq.enqueue('sentinel2', 'ping')")
        assert await asyncio.wait_for(heard.get(), timeout=10) == "sql 1 sentinel2"
    finally:
        await listener.close()
    statuses = {j["queue"]: j["status"] for j in await _jobs(conn)}
    assert statuses == {"sentinel": "pending", "later": "scheduled", "quiet": "pending",
                        "sentinel2": "pending"}  # fmt: skip


PRODUCER = """
import asyncio, sys
import asyncpg

async def main():
    conn = await asyncpg.connect(sys.argv[1])
    tx = conn.transaction()
    await tx.start()
    await conn.execute("INSERT INTO shop_orders VALUES (3, 12)")
    job_id = await conn.fetchval("SELECT jobq.enqueue('emails', 'receipt')")
    print(job_id, flush=True)
    await asyncio.sleep(120)  # killed here, before the commit

asyncio.run(main())
"""


async def test_a_producer_killed_before_its_commit_leaves_no_job(
    conn: asyncpg.Connection, database_url: str
) -> None:
    producer = await asyncio.create_subprocess_exec(
        sys.executable, "-c", PRODUCER, database_url, stdout=asyncio.subprocess.PIPE
    )
    try:
        assert producer.stdout is not None
        line = await asyncio.wait_for(producer.stdout.readline(), timeout=30)
        assert line.strip().isdigit(), line  # enqueued, uncommitted
    finally:
        producer.send_signal(signal.SIGKILL)
        await asyncio.wait_for(producer.wait(), timeout=30)
    assert producer.returncode == -signal.SIGKILL
    # PostgreSQL rolls the dead session's transaction back once it notices the closed socket.
    for _ in range(200):
        if not await conn.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE state LIKE 'idle in transaction%' "
            "AND datname = current_database()"
        ):
            break
        await asyncio.sleep(0.05)
    assert await _jobs(conn) == []
    assert await conn.fetchval("SELECT count(*) FROM shop_orders") == 0


@pytest.mark.parametrize(
    ("call", "column"),
    [
        ("jobq.enqueue('bad queue', 't')", "queue"),
        ("jobq.enqueue('', 't')", "queue"),
        ("jobq.enqueue(NULL, 't')", "queue"),
        ("jobq.enqueue('q', '')", "type"),
        ("jobq.enqueue('q', repeat('t', 256))", "type"),
        ("jobq.enqueue('q', 't', priority => NULL)", "priority"),
        ("jobq.enqueue('q', 't', run_at => now(), delay_seconds => 1)", "run_at"),
        ("jobq.enqueue('q', 't', run_at => '9999-01-01')", "run_at"),
        ("jobq.enqueue('q', 't', delay_seconds => -1)", "delay_seconds"),
        ("jobq.enqueue('q', 't', delay_seconds => 'NaN')", "delay_seconds"),
        ("jobq.enqueue('q', 't', max_attempts => 0)", "max_attempts"),
        ("jobq.enqueue('q', 't', lease_seconds => 0)", "lease_seconds"),
        ("jobq.enqueue('q', 't', lease_seconds => 43201)", "lease_seconds"),
        ("jobq.enqueue('q', 't', timeout_seconds => 0)", "timeout_seconds"),
        ("jobq.enqueue('q', 't', idempotency_key => '')", "idempotency_key"),
        ("jobq.enqueue('q', 't', concurrency_key => repeat('k', 256))", "concurrency_key"),
        (
            "jobq.enqueue('q', 't', jsonb_build_object('x', repeat('a', 1048576)))",
            "payload",
        ),
    ],
)
async def test_bad_arguments_are_refused_naming_the_parameter_and_nothing_is_written(
    conn: asyncpg.Connection, call: str, column: str
) -> None:
    with pytest.raises(asyncpg.InvalidParameterValueError) as refused:
        await conn.fetchval(f"SELECT {call}")
    assert refused.value.sqlstate == "22023"
    assert refused.value.column_name == column
    assert f": {column}:" in str(refused.value)
    assert await _jobs(conn) == []


async def test_an_idempotency_key_answers_its_job_and_refuses_other_arguments(
    conn: asyncpg.Connection,
) -> None:
    call = "SELECT jobq.enqueue('emails', 'receipt', $1::jsonb, idempotency_key => 'order-4')"
    first = await conn.fetchval(call, json.dumps({"order": 4}))
    assert await conn.fetchval(call, json.dumps({"order": 4})) == first
    with pytest.raises(asyncpg.UniqueViolationError) as reused:
        await conn.fetchval(call, json.dumps({"order": 5}))
    assert reused.value.column_name == "idempotency_key"
    assert len(await _jobs(conn)) == 1


async def test_a_valid_traceparent_is_kept_and_a_bad_one_dropped(conn: asyncpg.Connection) -> None:
    good = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    await conn.fetchval("SELECT jobq.enqueue('q', 't', traceparent => $1)", good)
    await conn.fetchval("SELECT jobq.enqueue('q', 't', traceparent => 'nonsense')")
    assert [j["traceparent"] for j in await _jobs(conn)] == [good, None]


async def test_a_role_granted_jobq_producer_can_enqueue_and_do_nothing_else(
    conn: asyncpg.Connection, database_url: str
) -> None:
    role = f"shop_{uuid.uuid4().hex[:8]}"
    await conn.execute(f"CREATE ROLE {role} LOGIN")
    await conn.execute(f"GRANT jobq_producer TO {role}")
    await conn.execute(
        f"GRANT CONNECT ON DATABASE {await conn.fetchval('SELECT current_database()')} TO {role}"
    )
    try:
        shop = await asyncpg.connect(database_url, user=role)
        try:
            job_id = await shop.fetchval("SELECT jobq.enqueue('emails', 'receipt')")
            assert isinstance(job_id, int)
            for forbidden in (
                "SELECT count(*) FROM jobs",
                "INSERT INTO jobs (queue, type) VALUES ('q', 't')",
                "UPDATE jobs SET status = 'succeeded'",
                "DELETE FROM jobs",
                "SELECT * FROM jobq.enqueue_limits",
                "UPDATE jobq.enqueue_limits SET payload_max_bytes = 1",
                "SELECT count(*) FROM api_keys",
            ):
                with pytest.raises(asyncpg.InsufficientPrivilegeError):
                    await shop.execute(forbidden)
        finally:
            await shop.close()
    finally:
        await conn.execute(f"DROP OWNED BY {role}")
        await conn.execute(f"DROP ROLE {role}")
    [job] = await _jobs(conn)
    assert job["id"] == job_id


async def test_a_role_without_the_grant_cannot_call_it(
    conn: asyncpg.Connection, database_url: str
) -> None:
    role = f"other_{uuid.uuid4().hex[:8]}"
    await conn.execute(f"CREATE ROLE {role} LOGIN")
    try:
        other = await asyncpg.connect(database_url, user=role)
        try:
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await other.fetchval("SELECT jobq.enqueue('emails', 'receipt')")
        finally:
            await other.close()
    finally:
        await conn.execute(f"DROP OWNED BY {role}")
        await conn.execute(f"DROP ROLE {role}")
    assert await _jobs(conn) == []


async def test_sqlalchemy_callers_enqueue_in_their_session_transaction(
    conn: asyncpg.Connection, engine: AsyncEngine
) -> None:
    # As docs/guides/producers.md shows it: the business write and the job in one SQLAlchemy transaction.
    async with engine.begin() as session_conn:
        await session_conn.execute(text("INSERT INTO shop_orders VALUES (5, 1)"))
        job_id = (
            await session_conn.execute(
                text("SELECT jobq.enqueue('emails', 'receipt', CAST(:payload AS jsonb))"),
                {"payload": json.dumps({"order": 5})},
            )
        ).scalar_one()
    [job] = await _jobs(conn)
    assert job["id"] == job_id and json.loads(job["payload"]) == {"order": 5}
