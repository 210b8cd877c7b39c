"""The awaited mark and a concurrent finish never miss each other; only awaited jobs notify."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db import driver_dsn
from app.queue.results import CHANNEL
from app.store.conn import Conn
from tests.integration.helpers import stores
from tests.locks import someone_waits_on_a_lock
from tests.polling import poll_until

REPO = stores().jobs
FINISH = "UPDATE jobs SET status = 'succeeded', finished_at = now() WHERE id = $1"


@pytest.fixture
async def connections(database_url: str) -> AsyncIterator[list[Any]]:
    """Three connections of their own: a finisher, a marker, a listener."""
    conns = [await asyncpg.connect(driver_dsn(database_url)) for _ in range(3)]
    yield conns
    for conn in conns:
        await conn.close()


async def _job(engine: AsyncEngine, status: str = "running") -> int:
    async with engine.begin() as conn:
        job_id = await conn.scalar(
            text(
                "INSERT INTO jobs (queue, type, status, max_attempts, lease_seconds) "
                "VALUES ('q', 't', :status, 1, 30) RETURNING id"
            ),
            {"status": status},
        )
    return int(job_id)


async def _listening(listener: Any) -> list[str]:
    heard: list[str] = []
    await listener.add_listener(CHANNEL, lambda *args: heard.append(args[3]))
    return heard


async def _heard_up_to_a_marker(listener: Any, heard: list[str], other: Any) -> list[str]:
    """What the listener heard before a marker sent now (notifications come in commit order)."""
    await other.execute("SELECT pg_notify($1, 'marker')", CHANNEL)
    await poll_until(lambda: "marker" in heard, within=5, what="the marker")
    return heard[: heard.index("marker")]


async def test_a_mark_behind_an_uncommitted_finish_waits_and_finds_it_finished(
    clean_db: AsyncEngine, connections: list[Any]
) -> None:
    finisher, marker, listener = connections
    heard = await _listening(listener)
    job_id = await _job(clean_db)
    finishing = finisher.transaction()
    await finishing.start()
    await finisher.execute(FINISH, job_id)
    mark = asyncio.create_task(REPO.job_await_mark(Conn.of(marker), job_id=job_id))
    await poll_until(lambda: someone_waits_on_a_lock(clean_db), within=5, what="the mark to wait")
    await finishing.commit()
    assert await asyncio.wait_for(mark, 5) is None  # re-checked on the committed row: finished
    row = await REPO.job_get(Conn.of(marker), job_id=job_id)
    assert row is not None and row.status == "succeeded" and row.awaited is False
    # Nobody waited when it finished: no notification.
    assert await _heard_up_to_a_marker(listener, heard, finisher) == []


async def test_a_finish_behind_an_uncommitted_mark_sees_it_and_notifies(
    clean_db: AsyncEngine, connections: list[Any]
) -> None:
    finisher, marker, listener = connections
    heard = await _listening(listener)
    job_id = await _job(clean_db)
    marking = marker.transaction()
    await marking.start()
    row = await REPO.job_await_mark(Conn.of(marker), job_id=job_id)
    assert row is not None and row.awaited is True and row.status == "running"
    finish = asyncio.create_task(finisher.execute(FINISH, job_id))
    await poll_until(lambda: someone_waits_on_a_lock(clean_db), within=5, what="the finish to wait")
    await marking.commit()
    await asyncio.wait_for(finish, 5)
    assert await _heard_up_to_a_marker(listener, heard, marker) == [str(job_id)]


async def test_only_a_finish_of_an_awaited_job_notifies_and_a_repeat_mark_writes_nothing(
    clean_db: AsyncEngine, connections: list[Any]
) -> None:
    finisher, marker, listener = connections
    heard = await _listening(listener)
    plain, waited, deleted = [await _job(clean_db, "pending") for _ in range(3)]
    assert await REPO.job_await_mark(Conn.of(marker), job_id=waited) is not None
    assert await REPO.job_await_mark(Conn.of(marker), job_id=deleted) is not None
    # Awaited already: no second row version (the read after it says why nothing came back).
    version = await marker.fetchval("SELECT xmin::text FROM jobs WHERE id = $1", waited)
    assert await REPO.job_await_mark(Conn.of(marker), job_id=waited) is None
    assert await marker.fetchval("SELECT xmin::text FROM jobs WHERE id = $1", waited) == version
    # Moves that do not finish, then finishes; the plain job never notifies.
    for job_id in (plain, waited):
        await finisher.execute("UPDATE jobs SET status = 'running' WHERE id = $1", job_id)
        await finisher.execute("UPDATE jobs SET status = 'dead' WHERE id = $1", job_id)
        await finisher.execute("UPDATE jobs SET last_error = 'again' WHERE id = $1", job_id)
    await finisher.execute("DELETE FROM jobs WHERE id = $1", deleted)  # unfinished: notifies
    await finisher.execute("DELETE FROM jobs WHERE id = $1", waited)  # finished: told already
    assert await _heard_up_to_a_marker(listener, heard, finisher) == [str(waited), str(deleted)]
    assert await REPO.job_await_mark(Conn.of(marker), job_id=999_999) is None


async def test_settled_lists_the_finished_and_the_gone(
    clean_db: AsyncEngine, connections: list[Any]
) -> None:
    done, running, scheduled = (
        await _job(clean_db, "cancelled"),
        await _job(clean_db),
        await _job(clean_db, "scheduled"),
    )
    async with clean_db.connect() as conn:
        settled = await REPO.job_await_settled(
            Conn.of(conn), job_ids=[done, running, scheduled, 999_999]
        )
        assert sorted(settled) == sorted([done, 999_999])
        assert await REPO.job_await_settled(Conn.of(conn), job_ids=[]) == []
