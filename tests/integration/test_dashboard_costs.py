"""A refresh of each dashboard page costs a bounded number of buffers with 1,000,000 finished jobs.

The pages are rendered for real (the app on a database seeded as ``bench/plans.py`` seeds, with
a million finished jobs); every repository call a page makes is recorded, then run again with
each of its statements under ``EXPLAIN (ANALYZE, BUFFERS)``. A page whose statements scanned the
history would touch tens of thousands of buffers (the jobs table alone is far larger); the bound
below is what a handful of index probes and one page of rows need.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from asgi_lifespan import LifespanManager
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import NullPool

from app.db import async_url
from app.main import create_app
from app.settings import Settings
from app.store import STORE_OF_FILE
from bench.plans import buffers, explain, nodes, seed_history
from tests.integration.helpers import migrated_database, stores

FINISHED = 1_000_000
# Buffers one refresh of a page may touch, all its statements together.
PAGE_BUFFERS = 2_000

# The stores' read methods a page may call (the actions are not refreshes).
_READS = (
    "queue_stats",
    "queue_throughput",
    "job_list",
    "job_get",
    "job_count",
    "worker_list",
    "audit_list",
    "queue_window_stats",
)

PAGES = {
    "overview": "/dashboard",
    "a busy queue": "/dashboard/queues/busy0",
    "a small queue under a long history": "/dashboard/queues/small",
    "jobs": "/dashboard/jobs",
    "jobs of a queue": "/dashboard/jobs?queue=busy1",
    "dead jobs": "/dashboard/jobs?state=dead",
    "jobs by payload": '/dashboard/jobs?payload={{"user":42}}',
    "a job": "/dashboard/jobs/{job_id}",
    "workers": "/dashboard/workers",
    "audit": "/dashboard/audit",
}


@pytest.fixture(scope="module")
def history_url(pg_server_url: str) -> Iterator[str]:
    yield from migrated_database("session", pg_server_url, "jobq_dashboard")


@pytest.fixture(scope="module")
async def seeded(history_url: str) -> AsyncIterator[dict[str, int]]:
    engine: AsyncEngine = create_async_engine(async_url(history_url), poolclass=NullPool)
    try:
        async with engine.begin() as conn:
            await seed_history(conn, finished=FINISHED)
            job_id = await conn.scalar(
                text(
                    "INSERT INTO jobs (queue, type, payload, max_attempts, lease_seconds, "
                    "status, attempts, errors, last_error, finished_at) "
                    """VALUES ('busy1', 'work', '{"user": 42}', 3, 30, 'dead', 3, """
                    """'[{"attempt": 1, "error": "boom", "worker_id": "w"}]', 'boom', now()) """
                    "RETURNING id"
                )
            )
            # Some leases held, for the workers page.
            await conn.execute(
                text(
                    "UPDATE jobs SET status = 'running', worker_id = 'w' || (id % 3), "
                    "lease_id = gen_random_uuid(), lease_expires_at = now() + interval '1 min', "
                    "started_at = now(), attempts = 1 "
                    "WHERE id IN (SELECT id FROM jobs WHERE queue = 'c0' AND status = 'pending' "
                    "LIMIT 20)"
                )
            )
            await conn.execute(text("ANALYZE jobs"))
        yield {"job_id": int(job_id)}
    finally:
        await engine.dispose()


async def _recorded_reads(
    url: str, path: str, monkeypatch: pytest.MonkeyPatch
) -> list[tuple[str, dict[str, Any]]]:
    """Renders the page (and its refresh fragment) and answers the repository reads it made."""
    calls: list[tuple[str, dict[str, Any]]] = []
    for name in _READS:
        [store_class] = [c for c in STORE_OF_FILE.values() if hasattr(c, name)]
        original = getattr(store_class, name)

        async def spy(
            self: Any, conn: Any, *, _n: str = name, _o: Any = original, **kw: Any
        ) -> Any:
            calls.append((_n, kw))
            return await _o(self, conn, **kw)

        monkeypatch.setattr(store_class, name, spy)
    app = create_app(Settings(database_url=url, maintenance_enabled=False))
    async with LifespanManager(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://jobq.test") as client:
            for headers in ({}, {"HX-Request": "true"}):
                r = await client.get(path, headers=headers)
                assert r.status_code == 200, (path, r.status_code, r.text[:300])
    monkeypatch.undo()
    return calls


@pytest.mark.parametrize("page", list(PAGES))
async def test_a_page_refresh_reads_a_bounded_number_of_buffers(
    page: str,
    history_url: str,
    seeded: dict[str, int],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    path = PAGES[page].format(job_id=seeded["job_id"])
    calls = await _recorded_reads(history_url, path, monkeypatch)
    assert calls, f"{page}: the page read nothing through the stores?"
    every = stores()
    methods = {
        name: getattr(store, name)
        for store in (every.jobs, every.queues, every.audit)
        for name in _READS
        if hasattr(store, name)
    }
    engine = create_async_engine(async_url(history_url), poolclass=NullPool)
    total = 0
    try:
        async with engine.connect() as conn:
            for name, kw in calls:
                plans = await explain(conn, lambda c, n=name, k=kw: methods[n](c, **k))
                for plan in plans:
                    scans = [
                        n
                        for n in nodes(plan.plan)
                        if n.get("Node Type") == "Seq Scan" and n.get("Relation Name") == "jobs"
                    ]
                    assert not scans, f"{page}: {name} scans the jobs table"
                    total += buffers(plan.plan)
    finally:
        await engine.dispose()
    # Two renders (the page and its fragment) were recorded.
    assert total <= 2 * PAGE_BUFFERS, f"{page}: {total} buffers for {len(calls)} reads"
