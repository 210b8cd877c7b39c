"""The client against a real ``jobq serve`` whose connections break: the keep-alive race, lost answers.

Between the client and the server a TCP proxy (tests/dropping_proxy.py) resets connections at
the worst moments: a pooled connection just as its next request goes out (the server's idle
timeout firing then), or after the server did the work but before its answer came back.
"""

from __future__ import annotations

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from jobq_client import Client, Step
from tests.dropping_proxy import DroppingProxy
from tests.processes import JobqServers

QUEUE = "dropped"
ROUNDS = 10


async def jobs_in_queue(engine: AsyncEngine) -> int:
    async with engine.connect() as conn:
        count = await conn.scalar(text("SELECT count(*) FROM jobs WHERE queue = :q"), {"q": QUEUE})
    return int(count or 0)


async def test_requests_on_a_connection_the_server_closes_as_they_go_out_all_succeed(
    jobq_servers: JobqServers, clean_db: AsyncEngine
) -> None:
    server = await jobq_servers.start()
    async with DroppingProxy(server.port) as proxy, Client(proxy.url) as client:
        first = await client.enqueue("t", {"round": 0}, queue=QUEUE)
        proxy.drop_reused = 2 * ROUNDS  # every request below goes out on a pooled connection
        for round_number in range(1, ROUNDS + 1):
            job = await client.enqueue("t", {"round": round_number}, queue=QUEUE)
            assert job["payload"] == {"round": round_number}
            read = await client.get_job(first["id"])
            assert read["id"] == first["id"]
        assert proxy.dropped == 2 * ROUNDS  # the race did happen, every time
    assert await jobs_in_queue(clean_db) == ROUNDS + 1


async def test_an_enqueue_whose_answer_was_lost_is_sent_again_and_creates_one_job(
    jobq_servers: JobqServers, clean_db: AsyncEngine
) -> None:
    server = await jobq_servers.start()
    async with DroppingProxy(server.port) as proxy, Client(proxy.url) as client:
        proxy.drop_answers = 1
        job = await client.enqueue("t", {"n": 1}, queue=QUEUE)
        assert proxy.dropped == 1
        # The batch too: its jobs got keys of their own, so the second send finds them.
        proxy.drop_answers = 1
        batch = await client.enqueue_batch(
            [{"queue": QUEUE, "type": "t", "payload": {"n": n}} for n in (2, 3)]
        )
        assert proxy.dropped == 2
        # A key of the caller's own is sent as it is, and stands for the job it made.
        proxy.drop_answers = 1
        keyed = await client.enqueue("t", queue=QUEUE, idempotency_key="order-7")
        again = await client.enqueue("t", queue=QUEUE, idempotency_key="order-7")
        assert proxy.dropped == 3
    assert keyed["idempotency_key"] == "order-7" and again["id"] == keyed["id"]
    assert job["payload"] == {"n": 1} and job["idempotency_key"]
    assert [j["payload"] for j in batch] == [{"n": 2}, {"n": 3}]
    assert await jobs_in_queue(clean_db) == 4


async def test_a_workflow_create_whose_answer_was_lost_is_sent_again_and_creates_one(
    jobq_servers: JobqServers, clean_db: AsyncEngine
) -> None:
    server = await jobq_servers.start()
    steps = [Step("a", "t", queue=QUEUE), Step("b", "t", queue=QUEUE, after=["a"])]
    async with DroppingProxy(server.port) as proxy, Client(proxy.url) as client:
        proxy.drop_answers = 1
        flow = await client.workflow("w", steps)
        assert proxy.dropped == 1
        # A key of the caller's own is sent as it is, and stands for the workflow it made.
        proxy.drop_answers = 1
        keyed = await client.workflow("w", steps, idempotency_key="nightly-7")
        again = await client.workflow("w", steps, idempotency_key="nightly-7")
        assert proxy.dropped == 2
    assert again["id"] == keyed["id"] != flow["id"]
    async with clean_db.connect() as conn:
        workflows = await conn.scalar(text("SELECT count(*) FROM workflows"))
    assert workflows == 2
    assert await jobs_in_queue(clean_db) == 4


async def test_a_lost_completion_answer_is_a_replay_and_a_claim_is_never_sent_twice(
    jobq_servers: JobqServers, clean_db: AsyncEngine
) -> None:
    server = await jobq_servers.start()
    async with DroppingProxy(server.port) as proxy, Client(proxy.url) as client:
        job = await client.enqueue("t", queue=QUEUE)
        [claimed] = await client.claim("w-1", [QUEUE])
        lease = {"job_id": job["id"], "lease_id": claimed["lease_id"]}
        proxy.drop_answers = 1
        [result] = await client.complete("w-1", [{**lease, "result": {"ok": 1}}])
        assert proxy.dropped == 1
        done = await client.get_job(job["id"])
        assert result["ok"] is True
        assert done["status"] == "succeeded" and done["result"] == {"ok": 1}

        # A claim is not sent again: a second one could lease more jobs while the first one's,
        # leased with an answer nobody read, wait for their leases to expire.
        await client.enqueue("t", queue=QUEUE)
        connections = proxy.connections
        proxy.drop_answers = 1
        with pytest.raises(httpx.TransportError):
            await client.claim("w-1", [QUEUE])
        assert proxy.connections == connections and proxy.dropped == 2

        # Nor is a complete that claims the next jobs: its claim is a claim. The complete itself
        # is done, and repeating it without the claim is answered as a replay.
        await client.enqueue("t", queue=QUEUE)
        [held] = await client.claim("w-2", [QUEUE], lease_seconds=60)
        await client.enqueue("t", queue=QUEUE)
        lease = {"job_id": held["id"], "lease_id": held["lease_id"]}
        connections = proxy.connections
        proxy.drop_answers = 1
        with pytest.raises(httpx.TransportError):
            await client.complete("w-2", [lease], claim_next={"queues": [QUEUE]})
        assert proxy.connections == connections and proxy.dropped == 3
        [replayed] = await client.complete("w-2", [lease])
        assert replayed["ok"] is True and replayed["status"] == "succeeded"
    async with clean_db.connect() as conn:
        running = (
            (
                await conn.execute(
                    text("SELECT worker_id FROM jobs WHERE queue = :q AND status = 'running'"),
                    {"q": QUEUE},
                )
            )
            .scalars()
            .all()
        )
    # The job the lost answer leased waits out its lease (the claim above's did the same).
    assert sorted(running) == ["w-1", "w-2"]
