"""Deploys as production meets them: one of two instances stopped under load, two instances
migrating a fresh database at the same moment."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from alembic.script import ScriptDirectory
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import NullPool

from app.db import async_url
from app.migrations import alembic_config
from tests.acceptance.helpers import enqueue_batch, lease
from tests.conftest import create_database, drop_database
from tests.polling import poll_until
from tests.processes import JobqServers, ProcessRegistry

pytestmark = pytest.mark.acceptance

QUEUE = "deploy"
JOBS = 400
WORKERS = 8
# Short leases, fast maintenance: the job abandoned on the stopped instance comes back quickly.
FAST = {
    "JOBQ_REAPER_INTERVAL_SECONDS": "0.2",
    "JOBQ_ELECTION_INTERVAL_SECONDS": "0.5",
    "JOBQ_SHUTDOWN_GRACE_SECONDS": "5",
}
REAP_WITHIN_SECONDS = 5.0


def _no_keepalive() -> httpx.AsyncClient:
    # A connection per request: once the stopped instance closes its socket, a new request is
    # refused at connect, and no request is written to a connection the server is closing.
    return httpx.AsyncClient(timeout=30.0, limits=httpx.Limits(max_keepalive_connections=0))


async def test_sigterm_one_of_two_instances_under_load_loses_nothing(
    jobq_servers: JobqServers, clean_db: AsyncEngine
) -> None:
    first, second = await asyncio.gather(jobq_servers.start(FAST), jobq_servers.start(FAST))
    urls = [first.url, second.url]
    async with contextlib.AsyncExitStack() as stack:
        client = await stack.enter_async_context(_no_keepalive())
        admin = await stack.enter_async_context(httpx.AsyncClient(base_url=second.url))
        jobs = await enqueue_batch(admin, QUEUE, [{"n": n} for n in range(JOBS)])
        expected = {j["id"] for j in jobs}
        # A lease taken through the instance that will stop, and then abandoned by its worker:
        # the other instance must reap it once it expires.
        abandoned_job = await enqueue_batch(admin, "abandoned", [{"n": -1}])
        r = await client.post(
            f"{first.url}/v1/claim",
            json={"worker_id": "gone", "queues": ["abandoned"], "lease_seconds": 1},
        )
        [abandoned] = r.json()["jobs"]
        assert abandoned["id"] == abandoned_job[0]["id"]

        completed: Counter[int] = Counter()
        failures: list[str] = []
        refused = Counter[int]()
        stopped = asyncio.Event()

        async def call(instance: int, path: str, body: dict[str, Any]) -> httpx.Response | None:
            """One request; None when it was refused at connect (the instance is gone)."""
            try:
                response = await client.post(f"{urls[instance]}{path}", json=body)
            except httpx.ConnectError:
                if not stopped.is_set() or instance != 0:
                    failures.append(f"refused by instance {instance} before any stop")
                refused[instance] += 1
                return None
            except (httpx.ReadError, httpx.RemoteProtocolError) as exc:
                # A connection the kernel took into the listening socket's backlog just before
                # the stopping instance closed it is reset, never seen by jobq: to the client it
                # is a refusal after close too. Were it a request jobq served and then cut, the
                # retry through the other instance would show: a claim's jobs would be lost
                # until their leases expire, a completion counted twice.
                if not stopped.is_set() or instance != 0:
                    failures.append(f"{path} on instance {instance}: {exc!r}")
                refused[instance] += 1
                return None
            except httpx.TransportError as exc:
                failures.append(f"{path} on instance {instance}: {exc!r}")
                return None
            if response.status_code != 200:
                failures.append(f"{path} on instance {instance}: {response.status_code}")
            return response

        async def worker(index: int) -> None:
            worker_id = f"w{index}"
            instance = index % 2
            idle = 0
            while idle < 3:
                r = await call(
                    instance,
                    "/v1/claim",
                    {"worker_id": worker_id, "queues": [QUEUE], "max_jobs": 5, "wait_seconds": 0.2},
                )
                if r is None:
                    instance = 1  # the first instance is gone: go on through the other
                    continue
                held = r.json().get("jobs", []) if r.status_code == 200 else []
                idle = idle + 1 if not held else 0
                while held:
                    done = await call(
                        instance,
                        "/v1/complete",
                        {"worker_id": worker_id, "leases": [lease(j) for j in held]},
                    )
                    if done is None:
                        instance = 1  # complete the same leases through the other instance
                        continue
                    for res in done.json().get("results", []):
                        if res["ok"] and res["status"] == "succeeded":
                            completed[res["job_id"]] += 1
                    held = []

        tasks = [asyncio.create_task(worker(i)) for i in range(WORKERS)]
        # Stop the first instance once the work is well under way.
        await poll_until(lambda: sum(completed.values()) >= JOBS // 4, within=60)
        stopped.set()
        done_at_stop = sum(completed.values())
        stop_at = time.monotonic()
        first.send_signal(signal.SIGTERM)
        code = await first.wait_exit(10)
        assert code == 0, f"exit {code} after SIGTERM:\n{first.log_text()}"
        assert time.monotonic() - stop_at < 10
        await asyncio.wait_for(asyncio.gather(*tasks), timeout=120)

        assert failures == [], failures[:10]
        assert set(completed) == expected, f"lost: {sorted(expected - set(completed))[:10]}"
        twice = [job_id for job_id, n in completed.items() if n > 1]
        assert twice == [], f"completed twice: {twice[:10]}"
        assert refused[1] == 0
        # The stop came mid-run, and the first instance's workers met it and moved on.
        assert done_at_stop < JOBS and refused[0] >= 1, (done_at_stop, refused)

        # The abandoned lease expired a second after its claim: the surviving instance (now the
        # maintenance leader) puts it back within the bound.
        async def reaped() -> bool:
            async with clean_db.connect() as conn:
                status = await conn.scalar(
                    text("SELECT status FROM jobs WHERE id = :id"), {"id": abandoned["id"]}
                )
            return bool(status != "running")

        await poll_until(reaped, within=REAP_WITHIN_SECONDS + 2)
        async with clean_db.connect() as conn:
            row = (
                await conn.execute(
                    text(
                        "SELECT status, updated_at - (started_at + interval '1 second') AS late "
                        "FROM jobs WHERE id = :id"
                    ),
                    {"id": abandoned["id"]},
                )
            ).one()
        assert row.status in ("pending", "scheduled"), row
        assert row.late.total_seconds() <= REAP_WITHIN_SECONDS, f"reaped {row.late} after expiry"


@pytest.fixture
def fresh_database(pg_server_url: str) -> Iterator[str]:
    url = create_database(pg_server_url, prefix="jobq_fresh")
    yield url
    drop_database(pg_server_url, url)


async def test_two_instances_starting_on_a_fresh_database_migrate_it_once(
    processes: ProcessRegistry, fresh_database: str
) -> None:
    servers = JobqServers(processes, fresh_database)
    # Both spawned before either is ready: they race for the migration lock.
    first, second = servers.spawn(), servers.spawn()
    await asyncio.gather(first.wait_ready(), second.wait_ready())
    engine = create_async_engine(async_url(fresh_database), poolclass=NullPool)
    try:
        async with engine.connect() as conn:
            versions = (await conn.execute(text("SELECT version_num FROM alembic_version"))).all()
    finally:
        await engine.dispose()
    head = ScriptDirectory.from_config(alembic_config(fresh_database)).get_current_head()
    assert [v[0] for v in versions] == [head]
    async with httpx.AsyncClient() as client:
        r = await client.post(f"{first.url}/v1/jobs", json={"queue": "q", "type": "t"})
        assert r.status_code == 201
        r = await client.post(f"{second.url}/v1/claim", json={"worker_id": "w", "queues": ["q"]})
        assert [j["id"] for j in r.json()["jobs"]] == [1]
