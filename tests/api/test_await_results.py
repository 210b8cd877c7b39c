"""Awaiting a job's result: ``GET /v1/jobs/{id}?wait_seconds=`` answers when the job finishes."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg
import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.api.state import app_state
from app.auth.keys import Role
from app.db import driver_dsn
from app.queue.services import Services
from app.wakeup.result_backstop import ResultBackstop
from tests.api.helpers import claim, enqueue, lease, lease_call, running_app
from tests.keys import bearer, make_key
from tests.polling import poll_until

# How long a woken read may take to answer (a notification, one read, the response).
PROMPT_SECONDS = 2.0


def service_of(client: httpx.AsyncClient) -> Services:
    return app_state(client.app).running().services  # type: ignore[attr-defined]


def parked(client: httpx.AsyncClient, count: int = 1) -> Callable[[], Awaitable[bool]]:
    """Whether ``count`` reads are registered (a read registers just before it marks its job)."""

    async def check() -> bool:
        return service_of(client).results.hub.parked == count

    return check


def armed(client: httpx.AsyncClient, job_id: int) -> Callable[[], bool]:
    """Whether a read of the job waits to be woken (parked, and not woken since)."""
    return lambda: job_id in service_of(client).results.hub.waiting_jobs()


async def parked_on(
    client: httpx.AsyncClient, engine: AsyncEngine, job_id: int, count: int = 1
) -> None:
    """Polls until ``count`` reads are registered and the job is marked awaited."""
    await poll_until(parked(client, count), within=5, what="the reads to park")

    async def marked() -> bool:
        return await awaited(engine, job_id)

    await poll_until(marked, within=5, what="the job to be marked awaited")


async def wait(client: httpx.AsyncClient, job_id: int, wait_seconds: Any) -> httpx.Response:
    return await client.get(f"/v1/jobs/{job_id}", params={"wait_seconds": wait_seconds})


async def awaited(engine: AsyncEngine, job_id: int) -> bool:
    async with engine.connect() as conn:
        flag = await conn.scalar(text("SELECT awaited FROM jobs WHERE id = :id"), {"id": job_id})
    return bool(flag)


async def test_a_finished_job_is_answered_at_once(database_url: str, clean_db: AsyncEngine) -> None:
    async with running_app(database_url) as client:
        job = await enqueue(client, queue="r")
        [held] = await claim(client, queues=["r"])
        await lease_call(client, "complete", "w1", lease(held, result={"answer": 42}))
        started = time.monotonic()
        r = await wait(client, job["id"], 20)
        assert time.monotonic() - started < PROMPT_SECONDS
        assert r.status_code == 200, r.text
        assert r.json()["status"] == "succeeded" and r.json()["result"] == {"answer": 42}
        # Nobody waited for it to finish: it was not marked.
        assert not await awaited(clean_db, job["id"])


async def test_the_wait_ends_with_the_unfinished_job(
    database_url: str, clean_db: AsyncEngine
) -> None:
    async with running_app(database_url) as client:
        job = await enqueue(client, queue="r")
        started = time.monotonic()
        r = await wait(client, job["id"], 0.5)
        assert 0.45 <= time.monotonic() - started < 3
        assert r.status_code == 200, r.text
        assert r.json()["id"] == job["id"] and r.json()["status"] == "pending"
        assert await awaited(clean_db, job["id"])
        assert service_of(client).results.hub.parked == 0


async def test_without_a_wait_it_answers_as_before(
    client: httpx.AsyncClient, clean_db: AsyncEngine
) -> None:
    job = await enqueue(client, queue="r")
    for params in ({}, {"wait_seconds": 0}, {"wait_seconds": "0.0"}):
        r = await client.get(f"/v1/jobs/{job['id']}", params=params)
        assert r.status_code == 200 and r.json()["status"] == "pending"
    assert not await awaited(clean_db, job["id"])


@pytest.mark.parametrize("wait_seconds", [None, 5])
async def test_an_unknown_job_is_a_404_at_once(
    client: httpx.AsyncClient, wait_seconds: int | None
) -> None:
    params = {} if wait_seconds is None else {"wait_seconds": wait_seconds}
    started = time.monotonic()
    for job_id in (999_999, 2**63):  # unknown, and past the id range
        r = await client.get(f"/v1/jobs/{job_id}", params=params)
        assert r.status_code == 404, r.text
        assert r.headers["content-type"].startswith("application/problem+json")
    assert time.monotonic() - started < PROMPT_SECONDS


@pytest.mark.parametrize("wait_seconds", ["-1", "21", "abc", "nan", "inf", ""])
async def test_a_bad_wait_is_a_422_naming_it(client: httpx.AsyncClient, wait_seconds: str) -> None:
    job = await enqueue(client, queue="r")
    r = await wait(client, job["id"], wait_seconds)
    assert r.status_code == 422, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    assert [e["field"] for e in r.json()["errors"]] == ["query.wait_seconds"]


async def _complete(client: httpx.AsyncClient, held: dict[str, Any]) -> str:
    [done] = await lease_call(client, "complete", "w1", lease(held, result={"ok": True}))
    return str(done["status"])


async def _fail_to_dead(client: httpx.AsyncClient, held: dict[str, Any]) -> str:
    [done] = await lease_call(client, "fail", "w1", lease(held, error="boom", retryable=False))
    return str(done["status"])


async def _cancel(client: httpx.AsyncClient, held: dict[str, Any]) -> str:
    r = await client.post(f"/v1/jobs/{held['id']}/cancel")
    assert r.status_code == 200, r.text
    return str(r.json()["status"])


@pytest.mark.parametrize(
    ("finish", "status"),
    [(_complete, "succeeded"), (_fail_to_dead, "dead"), (_cancel, "cancelled")],
)
async def test_a_parked_read_is_answered_when_its_job_finishes(
    database_url: str,
    clean_db: AsyncEngine,
    finish: Callable[[httpx.AsyncClient, dict[str, Any]], Awaitable[str]],
    status: str,
) -> None:
    async with running_app(database_url) as client:
        job = await enqueue(client, queue="r", max_attempts=1)
        [held] = await claim(client, queues=["r"])
        waiting = asyncio.create_task(wait(client, job["id"], 15))
        await parked_on(client, clean_db, job["id"])
        # A change that does not finish the job (a heartbeat) leaves the read parked.
        await lease_call(client, "heartbeat", "w1", lease(held, progress={"done": 1}))
        assert await finish(client, held) == status
        finished = time.monotonic()
        r = await asyncio.wait_for(waiting, PROMPT_SECONDS)
        assert time.monotonic() - finished < PROMPT_SECONDS
        assert r.status_code == 200, r.text
        assert r.json()["status"] == status and r.json()["progress"] == {"done": 1}


async def test_a_retry_does_not_answer_and_the_read_parks_again(
    database_url: str, clean_db: AsyncEngine
) -> None:
    async with running_app(database_url) as client:
        job = await enqueue(client, queue="r")
        [held] = await claim(client, queues=["r"])
        waiting = asyncio.create_task(wait(client, job["id"], 15))
        await parked_on(client, clean_db, job["id"])
        # Back to pending (a release): not finished, so nothing wakes the read.
        await lease_call(client, "release", "w1", lease(held))
        # Every waiter woken (as after a reconnect): it re-reads and parks again.
        service_of(client).results.hub.notified(None)
        await poll_until(armed(client, job["id"]), within=5, what="the read to park again")
        assert not waiting.done()
        [again] = await claim(client, queues=["r"])
        assert await _complete(client, again) == "succeeded"
        r = await asyncio.wait_for(waiting, PROMPT_SECONDS)
        assert (
            r.json()["status"] == "succeeded" and r.json()["attempts"] == 1
        )  # a release charges none


async def test_a_job_deleted_while_waited_for_answers_404(
    database_url: str, clean_db: AsyncEngine
) -> None:
    async with running_app(database_url) as client:
        job = await enqueue(client, queue="r")
        waiting = asyncio.create_task(wait(client, job["id"], 15))
        await parked_on(client, clean_db, job["id"])
        async with clean_db.begin() as conn:
            await conn.execute(text("DELETE FROM jobs WHERE id = :id"), {"id": job["id"]})
        deleted = time.monotonic()
        r = await asyncio.wait_for(waiting, PROMPT_SECONDS)
        assert time.monotonic() - deleted < PROMPT_SECONDS
        assert r.status_code == 404, r.text


async def test_a_bulk_delete_of_an_answered_job_notifies_nobody(
    database_url: str, clean_db: AsyncEngine
) -> None:
    # A finished job's readers were answered when it finished: deleting it sends nothing.
    async with running_app(database_url) as client:
        job = await enqueue(client, queue="r")
        waiting = asyncio.create_task(wait(client, job["id"], 15))
        await parked_on(client, clean_db, job["id"])
        assert await _cancel(client, {"id": job["id"]}) == "cancelled"
        assert (await asyncio.wait_for(waiting, PROMPT_SECONDS)).json()["status"] == "cancelled"
        listener = await asyncpg.connect(driver_dsn(database_url))
        try:
            heard: asyncio.Queue[str] = asyncio.Queue()
            await listener.add_listener("jobq_finished", lambda *args: heard.put_nowait(args[3]))
            r = await client.post("/v1/jobs/bulk/delete", json={"queue": "r"})
            assert r.status_code == 200 and r.json()["changed"] == 1, r.text
            # Notifications arrive in commit order: whatever the delete sent comes before this.
            async with clean_db.begin() as conn:
                await conn.execute(text("SELECT pg_notify('jobq_finished', 'marker')"))
            assert await asyncio.wait_for(heard.get(), 5) == "marker"
        finally:
            await listener.close()


async def test_shutdown_answers_parked_reads_at_once(
    database_url: str, clean_db: AsyncEngine
) -> None:
    async with running_app(database_url) as client:
        job = await enqueue(client, queue="r")
        waiting = [asyncio.create_task(wait(client, job["id"], 15)) for _ in range(3)]
        await parked_on(client, clean_db, job["id"], 3)
        closed = time.monotonic()
        app_state(client.app).running().begin_shutdown()  # type: ignore[attr-defined]
        answers = await asyncio.wait_for(asyncio.gather(*waiting), PROMPT_SECONDS)
        assert time.monotonic() - closed < PROMPT_SECONDS
        assert [a.json()["status"] for a in answers] == ["pending"] * 3
        # And a wait asked for now answers at once.
        started = time.monotonic()
        assert (await wait(client, job["id"], 15)).status_code == 200
        assert time.monotonic() - started < PROMPT_SECONDS


async def test_a_client_that_went_away_stops_waiting(
    database_url: str, clean_db: AsyncEngine
) -> None:
    async with running_app(database_url) as client:
        app: FastAPI = client.app  # type: ignore[attr-defined]
        job = await enqueue(client, queue="r")
        gone = asyncio.Event()
        sent: list[dict[str, Any]] = []
        delivered = False

        async def receive() -> dict[str, Any]:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": b"", "more_body": False}
            await gone.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        path = f"/v1/jobs/{job['id']}"
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "GET",
            "scheme": "http",
            "path": path,
            "raw_path": path.encode(),
            "query_string": b"wait_seconds=15",
            "root_path": "",
            "server": ("jobq.test", 80),
            "client": ("127.0.0.1", 5000),
            "headers": [],
        }
        ghost = asyncio.create_task(app(scope, receive, send))
        await parked_on(client, clean_db, job["id"])
        gone.set()
        await poll_until(parked(client, 0), within=PROMPT_SECONDS, what="the read to leave")
        await asyncio.wait_for(ghost, 5)


async def test_reads_of_one_job_on_one_instance_all_wake(
    database_url: str, clean_db: AsyncEngine
) -> None:
    async with running_app(database_url) as client:
        job = await enqueue(client, queue="r")
        other = await enqueue(client, queue="r")
        waiting = [asyncio.create_task(wait(client, job["id"], 15)) for _ in range(5)]
        bystander = asyncio.create_task(wait(client, other["id"], 15))
        await parked_on(client, clean_db, other["id"], 6)
        await parked_on(client, clean_db, job["id"], 6)
        [held] = await claim(client, queues=["r"])
        assert held["id"] == job["id"]
        assert await _complete(client, held) == "succeeded"
        answers = await asyncio.wait_for(asyncio.gather(*waiting), PROMPT_SECONDS)
        assert {a.json()["status"] for a in answers} == {"succeeded"}
        assert not bystander.done()
        await poll_until(parked(client, 1), within=5, what="only the bystander to wait")
        bystander.cancel()


async def test_the_backstop_wakes_reads_whose_job_finished_or_went(
    database_url: str, clean_db: AsyncEngine
) -> None:
    # Waiters registered by hand: no read marked these jobs, so no notification will come.
    async with running_app(database_url) as client:
        service = service_of(client)
        done = await enqueue(client, queue="r")
        [held] = await claim(client, queues=["r"])
        await _complete(client, held)
        pending = await enqueue(client, queue="r")
        waiters = {
            "done": service.results.hub.register(done["id"]),
            "pending": service.results.hub.register(pending["id"]),
            "gone": service.results.hub.register(999_999),
        }
        backstop = ResultBackstop(services=service)
        assert await backstop.run_once() == 2
        assert {name: w.woken for name, w in waiters.items()} == {
            "done": True,
            "pending": False,
            "gone": True,
        }
        # Woken waiters are not asked about again until they park again.
        assert await backstop.run_once() == 0
        for w in waiters.values():
            service.results.hub.unregister(w)
        assert service.results.hub.parked == 0 and await backstop.run_once() == 0


async def test_a_lost_notification_is_made_up_for_by_the_backstop(
    database_url: str, clean_db: AsyncEngine
) -> None:
    async with running_app(database_url, longpoll_backstop_seconds=0.2) as client:
        job = await enqueue(client, queue="r")
        waiting = asyncio.create_task(wait(client, job["id"], 15))
        await parked_on(client, clean_db, job["id"])
        # Finished with the trigger off for this transaction: the notification is "lost".
        async with clean_db.begin() as conn:
            await conn.execute(text("SET LOCAL session_replication_role = replica"))
            await conn.execute(
                text("UPDATE jobs SET status = 'cancelled' WHERE id = :id"), {"id": job["id"]}
            )
        r = await asyncio.wait_for(waiting, 5)
        assert r.json()["status"] == "cancelled"


async def test_the_control_connection_lost_and_back_still_wakes(
    database_url: str, clean_db: AsyncEngine
) -> None:
    async with running_app(database_url) as a, running_app(database_url) as b:
        control = app_state(b.app).running().control  # type: ignore[attr-defined]
        job = await enqueue(a, queue="r")
        waiting = asyncio.create_task(wait(b, job["id"], 15))
        await parked_on(b, clean_db, job["id"])
        lost = control._driver
        async with clean_db.begin() as conn:
            killed = await conn.scalar(
                text(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                    "WHERE application_name = 'jobq-control' AND datname = current_database()"
                )
            )
        assert killed
        await poll_until(
            lambda: control.connected and control._driver is not lost,
            within=10,
            what="the reconnect",
        )
        # Woken by the reconnect, it re-read the job and parked again.
        await poll_until(armed(b, job["id"]), within=5, what="the read to park again")
        assert not waiting.done()
        [held] = await claim(a, queues=["r"])
        assert await _complete(a, held) == "succeeded"
        r = await asyncio.wait_for(waiting, PROMPT_SECONDS)
        assert r.json()["status"] == "succeeded"


async def test_a_key_reads_and_waits_only_within_its_scopes(
    app: FastAPI, client: httpx.AsyncClient, clean_db: AsyncEngine
) -> None:
    viewer = await make_key(clean_db, "viewer", Role.VIEWER)
    scoped = await make_key(clean_db, "billing-viewer", Role.VIEWER, ["billing.*"])
    admin = await make_key(clean_db, "admin", Role.ADMIN)
    await app_state(app).running().keys.refresh()
    client.headers.update(bearer(admin))
    job = await enqueue(client, queue="emails")
    client.headers.update(bearer(scoped))
    r = await wait(client, job["id"], 0.2)
    assert r.status_code == 403, r.text
    assert not await awaited(clean_db, job["id"])  # refused before it was marked
    client.headers.update(bearer(viewer))
    r = await wait(client, job["id"], 0.2)
    assert r.status_code == 200 and r.json()["status"] == "pending"
    client.headers.pop("Authorization")
    assert (await wait(client, job["id"], 0.2)).status_code == 401
