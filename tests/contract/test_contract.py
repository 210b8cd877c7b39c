"""The clients' contract suite: one set of scenarios, run by every client's driver (clients/CONTRACT.md).

Each scenario drives a client only through its driver process (enqueue, wait, a worker it signals
and kills) and checks the outcome from outside: the job through the HTTP API, the rows where the
API cannot show them, and the service's access log for the calls a worker must never make.
"""

from __future__ import annotations

import re
import time
import uuid
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from jobq_client import Client
from tests.contract.conftest import KeyedService
from tests.contract.drivers import Driver
from tests.dropping_proxy import DroppingProxy
from tests.polling import poll_until
from tests.processes import JobqServer

pytestmark = pytest.mark.acceptance

SETTLE_CALL = re.compile(r'"POST /v1/(complete|fail|release)[ ?]')
FINISHED = {"succeeded", "dead", "cancelled"}


def log_mark(service: JobqServer) -> int:
    """Where the service's log ends now: the scenario reads only what comes after."""
    return len(service.log_text(tail=10**12))


def settle_calls_since(service: JobqServer, mark: int) -> list[str]:
    """The complete / fail / release requests the service logged after ``mark``."""
    lines = service.log_text(tail=10**12)[mark:].splitlines()
    return [line for line in lines if SETTLE_CALL.search(line)]


async def enqueued(driver: Driver, type: str, payload: Any = None, **fields: Any) -> dict[str, Any]:
    answer = await driver.enqueue(type, payload, **fields)
    assert answer["ok"] is True, answer
    job: dict[str, Any] = answer["job"]
    assert job["queue"] == driver.queue and job["type"] == type, job
    return job


async def checkpoint_reached(client: Client, job_id: int, chunks: int) -> dict[str, Any]:
    """Waits until the running job saved at least ``chunks`` chunks; answers the job."""
    seen: dict[str, Any] = {}

    async def saved() -> bool:
        seen.update(await client.get_job(job_id))
        return seen["status"] == "running" and (seen["checkpoint"] or {}).get("next", 0) >= chunks

    await poll_until(saved, within=30, what=f"{chunks} chunks saved")
    return seen


async def expire_lease(engine: AsyncEngine, client: Client, job_id: int) -> dict[str, Any]:
    """Backdates the job's lease until the service's reaper takes the job back; answers the job.

    A heartbeat of a live worker may extend the lease between the update and the reaper's next
    round, so the update repeats until the reaper took the job.
    """
    seen: dict[str, Any] = {}

    async def reaped() -> bool:
        async with engine.begin() as conn:
            await conn.execute(
                text(
                    "UPDATE jobs SET lease_expires_at = now() - interval '1 second' "
                    "WHERE id = :id AND status = 'running'"
                ),
                {"id": job_id},
            )
        seen.update(await client.get_job(job_id))
        return seen["status"] != "running"

    await poll_until(reaped, within=20, what="the reaper to take the expired lease back")
    return seen


async def take_over_lease(engine: AsyncEngine, job_id: int) -> None:
    """The job's lease expires and another worker claims it, in one step.

    Through the reaper and a claim, the worker under test would race the other worker for the
    requeued job (it long-polls the same queue), so the scenario writes the state such a claim
    leaves: a new lease under another worker, one more attempt.
    """
    async with engine.begin() as conn:
        taken = await conn.execute(
            text(
                "UPDATE jobs SET lease_id = gen_random_uuid(), worker_id = 'new-owner', "
                "lease_expires_at = now() + interval '60 seconds', attempts = attempts + 1 "
                "WHERE id = :id AND status = 'running'"
            ),
            {"id": job_id},
        )
    assert taken.rowcount == 1


async def test_enqueue_and_complete(driver: Driver) -> None:
    worker = driver.start_worker()
    job = await enqueued(driver, "echo", {"n": 1, "text": "héllo"})
    assert job["status"] not in FINISHED and job["attempts"] == 0

    done = await driver.wait(job["id"], 30)

    assert done["ok"] is True, done
    assert done["job"]["status"] == "succeeded", done
    assert done["job"]["result"] == {"echo": {"n": 1, "text": "héllo"}}
    [started] = worker.find("started", job["id"])
    assert started["type"] == "echo" and started["attempt"] == 1 and started["checkpoint"] is None


async def test_a_handler_error_is_recorded_with_its_type_message_and_stack(
    driver: Driver, service: JobqServer
) -> None:
    driver.start_worker()
    job = await enqueued(driver, "boom", {"message": "the disk is full"}, max_attempts=1)

    done = await driver.wait(job["id"], 30)

    assert done["ok"] is True and done["job"]["status"] == "dead", done
    last_error = done["job"]["last_error"]
    assert "ContractBoom" in last_error and "the disk is full" in last_error, last_error
    async with Client(service.url) as client:
        events = await client._call("GET", f"/v1/jobs/{job['id']}/events")
    [failure] = [e["data"] for e in events["events"] if e["kind"] == "failed"]
    assert "ContractBoom" in failure["type"], failure
    assert "the disk is full" in failure["error"], failure
    assert "boom" in (failure["traceback"] or ""), failure


async def test_a_lost_lease_aborts_the_handler_and_the_worker_settles_nothing(
    driver: Driver, service: JobqServer, engine: AsyncEngine
) -> None:
    worker = driver.start_worker(lease_seconds=6, heartbeat_seconds=0.3)
    job = await enqueued(driver, "hang")
    await worker.wait_for("started", job["id"])
    mark = log_mark(service)

    async with Client(service.url) as client:
        await take_over_lease(engine, job["id"])
        await worker.wait_for("aborted", job["id"], within=15)
        worker.terminate()
        assert await worker.child.wait_exit(20) == 0, worker.child.log_text()
        after = await client.get_job(job["id"])

    assert after["status"] == "running" and after["worker_id"] == "new-owner", after
    assert after["attempts"] == 2 and after["result"] is None, after
    assert settle_calls_since(service, mark) == []
    assert worker.find("stopped")


async def test_cancel_from_ops_aborts_the_handler_and_the_worker_settles_nothing(
    driver: Driver, service: JobqServer
) -> None:
    worker = driver.start_worker(lease_seconds=30, heartbeat_seconds=0.3)
    job = await enqueued(driver, "hang")
    await worker.wait_for("started", job["id"])
    mark = log_mark(service)

    async with Client(service.url) as client:
        cancelled = await client.cancel(job["id"])
        assert cancelled["status"] == "cancelled", cancelled
        await worker.wait_for("aborted", job["id"], within=15)
        worker.terminate()
        assert await worker.child.wait_exit(20) == 0, worker.child.log_text()
        after = await client.get_job(job["id"])

    assert after["status"] == "cancelled" and after["result"] is None, after
    assert settle_calls_since(service, mark) == []


async def test_after_sigkill_the_next_worker_resumes_from_the_last_checkpoint(
    driver: Driver, service: JobqServer, engine: AsyncEngine
) -> None:
    first = driver.start_worker(lease_seconds=30, heartbeat_seconds=1)
    job = await enqueued(driver, "chunked", {"chunks": 150, "chunk_seconds": 0.02})
    async with Client(service.url) as client:
        await checkpoint_reached(client, job["id"], 5)
        first.kill()
        assert await first.child.wait_exit(10) is not None
        killed = await client.get_job(job["id"])
        saved = killed["checkpoint"]["next"]
        assert 5 <= saved < 150 and killed["status"] == "running", killed
        await expire_lease(engine, client, job["id"])

        second = driver.start_worker(lease_seconds=30, heartbeat_seconds=1)
        done = await driver.wait(job["id"], 60)

    assert done["ok"] is True and done["job"]["status"] == "succeeded", done
    assert done["job"]["result"] == {"chunks": 150, "resumed_from": saved}
    [resumed] = second.find("started", job["id"])
    assert resumed["checkpoint"] == {"next": saved} and resumed["attempt"] == 2, resumed


async def test_sigterm_releases_the_job_with_its_checkpoint_at_once(
    driver: Driver, service: JobqServer
) -> None:
    first = driver.start_worker(lease_seconds=60, heartbeat_seconds=5, grace_seconds=20)
    job = await enqueued(driver, "chunked", {"chunks": 300, "chunk_seconds": 0.02})
    async with Client(service.url) as client:
        await checkpoint_reached(client, job["id"], 5)
        signalled = time.monotonic()
        first.terminate()

        async def released() -> bool:
            return (await client.get_job(job["id"]))["status"] != "running"

        await poll_until(released, within=10, what="the job to be released", interval=0.02)
        released_after = time.monotonic() - signalled
        assert await first.child.wait_exit(20) == 0, first.child.log_text()
        back = await client.get_job(job["id"])
        saved = back["checkpoint"]["next"]

        second = driver.start_worker(lease_seconds=60, heartbeat_seconds=5)
        done = await driver.wait(job["id"], 60)

    # Released by the worker, long before the 60 s lease could have expired.
    assert released_after < 10, released_after
    assert back["status"] == "pending" and back["lease_expires_at"] is None, back
    assert back["attempts"] == 0 and 5 <= saved < 300, back  # a release gives the attempt back
    assert back["progress"] == {"done": saved, "total": 300}, back
    assert first.find("stopped")
    assert done["ok"] is True and done["job"]["status"] == "succeeded", done
    assert done["job"]["result"] == {"chunks": 300, "resumed_from": saved}
    [resumed] = second.find("started", job["id"])
    assert resumed["checkpoint"] == {"next": saved}, resumed


async def test_an_enqueue_retried_after_a_dropped_connection_creates_one_job(
    driver: Driver, service: JobqServer, engine: AsyncEngine
) -> None:
    token = uuid.uuid4().hex
    async with DroppingProxy(service.port) as proxy:
        proxy.drop_answers = 1  # the server creates the job; its answer never arrives
        answer = await driver.with_key(None, url=proxy.url).enqueue("echo", {"token": token})
        dropped = proxy.dropped

    assert answer["ok"] is True, answer
    assert dropped == 1
    async with engine.connect() as conn:
        ids = (
            await conn.scalars(
                text("SELECT id FROM jobs WHERE queue = :q AND payload->>'token' = :t"),
                {"q": driver.queue, "t": token},
            )
        ).all()
    assert ids == [answer["job"]["id"]]


async def test_a_workflow_create_retried_after_a_dropped_connection_creates_one_workflow(
    driver: Driver, service: JobqServer, engine: AsyncEngine
) -> None:
    token = uuid.uuid4().hex
    steps = [
        {"name": "first", "type": "echo", "payload": {"token": token}},
        {"name": "second", "type": "echo", "payload": {"token": token}, "after": ["first"]},
    ]
    async with DroppingProxy(service.port) as proxy:
        proxy.drop_answers = 1  # the server creates the workflow; its answer never arrives
        answer = await driver.with_key(None, url=proxy.url).workflow(f"dropped-{token}", steps)
        dropped = proxy.dropped

    assert answer["ok"] is True, answer
    assert dropped == 1
    async with engine.connect() as conn:
        workflows = (
            await conn.scalars(
                text("SELECT id FROM workflows WHERE name = :n"), {"n": f"dropped-{token}"}
            )
        ).all()
        ids = (
            await conn.scalars(
                text("SELECT id FROM jobs WHERE queue = :q AND payload->>'token' = :t ORDER BY id"),
                {"q": driver.queue, "t": token},
            )
        ).all()
    assert workflows == [answer["workflow"]["id"]]
    assert ids == sorted(s["job"]["id"] for s in answer["workflow"]["steps"])


async def test_keys_no_key_is_401_a_viewer_key_403_a_producer_key_enqueues(
    driver: Driver, keyed_service: KeyedService
) -> None:
    url = keyed_service.server.url

    anonymous = await driver.with_key(None, url=url).enqueue("echo", 1)
    viewer = await driver.with_key(keyed_service.viewer_key, url=url).enqueue("echo", 2)
    producer = await driver.with_key(keyed_service.producer_key, url=url).enqueue("echo", 3)

    assert anonymous["ok"] is False and anonymous["status"] == 401, anonymous
    assert anonymous["problem"]["status"] == 401 and anonymous["problem"]["title"], anonymous
    assert viewer["ok"] is False and viewer["status"] == 403, viewer
    assert viewer["problem"]["status"] == 403 and viewer["problem"]["title"], viewer
    assert producer["ok"] is True and producer["job"]["payload"] == 3, producer
