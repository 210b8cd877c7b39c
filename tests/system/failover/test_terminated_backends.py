"""Backends terminated under load: every answer is 2xx, 4xx or a 503 with Retry-After, never a 500.

Two ``jobq serve`` instances on the session database. Producers enqueue jobs while the chaos lasts (each with
an idempotency key, sent again until acknowledged) while consumers claim and complete them
through both instances, and a chaos task runs ``pg_terminate_backend`` against every connection
the instances hold, over and over. A connection whose backend died mid-statement must never be
handed out again, and a request that lost its connection must be answered 503 (or retried on a
fresh one where that is safe), not 500. Once the chaos stops, every job must be completed
exactly once: a claim whose answer was lost comes back when its short lease expires.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import asyncpg
import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.acceptance.helpers import job_rows, lease
from tests.polling import poll_until
from tests.processes import JobqServer, JobqServers

pytestmark = pytest.mark.acceptance

QUEUE = "terminated"
PRODUCERS = 8
CONSUMERS = 12
MAX_JOBS = 4
CHAOS_SECONDS = 6.0
# Between two rounds of terminations: often enough that statements die mid-flight.
TERMINATE_EVERY_SECONDS = 0.02
# Short leases: jobs whose claim answer was lost come back soon through the reaper.
LEASE_SECONDS = 2
REQUEST_TIMEOUT_SECONDS = 10.0
DRAIN_WITHIN_SECONDS = 40.0
RETRY_PAUSE_SECONDS = 0.02  # between attempts of a request that got a 503: pacing, not waiting
SERVER_ENV = {
    "JOBQ_REAPER_INTERVAL_SECONDS": "0.2",
    # Jobs whose claim answer was lost are retried soon after their lease expires.
    "JOBQ_BACKOFF_BASE_SECONDS": "0.1",
    "JOBQ_BACKOFF_CAP_SECONDS": "0.5",
    "JOBQ_DB_POOL_TIMEOUT_SECONDS": "3",
}

# The service's connections (both pools) identify themselves so; the control connection is
# ``jobq-control`` and left alone, so the leader lock and LISTEN stay where they are.
TERMINATE_SERVICE_BACKENDS = """
SELECT count(pg_terminate_backend(pid))
FROM pg_stat_activity
WHERE datname = current_database() AND application_name = 'jobq' AND pid <> pg_backend_pid()
"""


@dataclass
class Tally:
    """Every answer the clients got, and what they know was acknowledged."""

    statuses: Counter[tuple[str, int]] = field(default_factory=Counter)
    wrong: list[str] = field(default_factory=list)
    enqueued: dict[str, int] = field(default_factory=dict)  # idempotency key -> job id
    completed: Counter[int] = field(default_factory=Counter)
    terminated: int = 0

    def answer(self, path: str, response: httpx.Response) -> bool:
        """Records an answer; whether it was a success."""
        status = response.status_code
        self.statuses[(path, status)] += 1
        if status == 503:
            if "retry-after" not in response.headers:
                self.wrong.append(f"{path}: 503 without Retry-After: {response.text[:300]}")
            elif not response.headers.get("content-type", "").startswith(
                "application/problem+json"
            ):
                self.wrong.append(f"{path}: 503 not problem+json: {response.text[:300]}")
        elif not (200 <= status < 300 or 400 <= status < 500):
            self.wrong.append(f"{path}: {status} {response.text[:300]}")
        return 200 <= status < 300


async def _post(
    client: httpx.AsyncClient, path: str, body: dict[str, Any], tally: Tally
) -> httpx.Response | None:
    r = await client.post(path, json=body)
    return r if tally.answer(path, r) else None


async def producer(
    clients: list[httpx.AsyncClient], name: str, stop: asyncio.Event, tally: Tally
) -> None:
    """Enqueues numbered jobs until ``stop``; each is sent again until an instance acknowledges it.

    Its idempotency key makes it one job however often it is sent, and tells its id at last.
    """
    n = 0
    while not stop.is_set():
        key = f"{name}-{n}"
        body = {
            "queue": QUEUE,
            "type": "chaos",
            "payload": {"key": key},
            "idempotency_key": key,
            "lease_seconds": LEASE_SECONDS,
            # A claim whose answer was lost costs an attempt when its lease expires.
            "max_attempts": 100,
        }
        while True:
            r = await _post(clients[n % len(clients)], "/v1/jobs", body, tally)
            if r is not None:
                tally.enqueued[key] = r.json()["id"]
                break
            await asyncio.sleep(RETRY_PAUSE_SECONDS)
        n += 1


async def consumer(
    client: httpx.AsyncClient, worker_id: str, stop: asyncio.Event, tally: Tally
) -> None:
    """Claims and completes until ``stop``; a lost answer leaves the job to its lease."""
    while not stop.is_set():
        body = {
            "worker_id": worker_id,
            "queues": [QUEUE],
            "max_jobs": MAX_JOBS,
            "lease_seconds": LEASE_SECONDS,
            "wait_seconds": 0.2,
        }
        r = await _post(client, "/v1/claim", body, tally)
        if r is None:
            await asyncio.sleep(RETRY_PAUSE_SECONDS)
            continue
        jobs: list[dict[str, Any]] = r.json()["jobs"]
        if not jobs:
            continue
        leases = [lease(job, result={"key": job["payload"]["key"]}) for job in jobs]
        for _ in range(3):  # a complete is idempotent: sent again, it answers the same success
            r = await _post(
                client, "/v1/complete", {"worker_id": worker_id, "leases": leases}, tally
            )
            if r is not None:
                for res in r.json()["results"]:
                    if res["ok"]:
                        tally.completed[res["job_id"]] += 1
                break
            await asyncio.sleep(RETRY_PAUSE_SECONDS)


async def chaos(database_url: str, stop: asyncio.Event, tally: Tally) -> None:
    """Terminates the instances' pooled backends every few milliseconds until ``stop``."""
    conn = await asyncpg.connect(database_url)
    try:
        while not stop.is_set():
            tally.terminated += await conn.fetchval(TERMINATE_SERVICE_BACKENDS)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), TERMINATE_EVERY_SECONDS)
    finally:
        await conn.close()


async def test_terminated_backends_answer_503_not_500_and_lose_nothing(
    jobq_servers: JobqServers, clean_db: AsyncEngine, database_url: str
) -> None:
    servers: list[JobqServer] = list(
        await asyncio.gather(*(jobq_servers.start(env=SERVER_ENV) for _ in range(2)))
    )
    tally = Tally()
    chaos_stop = asyncio.Event()
    consumers_stop = asyncio.Event()
    clients = [httpx.AsyncClient(base_url=s.url, timeout=REQUEST_TIMEOUT_SECONDS) for s in servers]
    try:
        chaos_task = asyncio.create_task(chaos(database_url, chaos_stop, tally))
        producers = [
            asyncio.create_task(producer(clients, f"producer-{p}", chaos_stop, tally))
            for p in range(PRODUCERS)
        ]
        consumers = [
            asyncio.create_task(
                consumer(clients[c % len(clients)], f"consumer-{c}", consumers_stop, tally)
            )
            for c in range(CONSUMERS)
        ]
        try:
            # The chaos runs for a while, then the service must recover and drain the queue.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(chaos_stop.wait(), CHAOS_SECONDS)
            chaos_stop.set()
            await chaos_task
            await asyncio.gather(*producers)

            async def all_succeeded() -> bool:
                assert not any(t.done() for t in consumers), "a consumer stopped early"
                rows = await job_rows(clean_db)
                return all(row["status"] == "succeeded" for row in rows.values())

            await poll_until(all_succeeded, within=DRAIN_WITHIN_SECONDS, what="every job succeeded")
        finally:
            chaos_stop.set()
            consumers_stop.set()
            outcomes = await asyncio.gather(
                chaos_task, *producers, *consumers, return_exceptions=True
            )
            for outcome in outcomes:
                if isinstance(outcome, BaseException):
                    raise outcome
    finally:
        for client in clients:
            await client.aclose()

    summary = dict(sorted(tally.statuses.items()))
    assert tally.terminated > 0, "the chaos terminated no backend"
    assert tally.enqueued, "no job was enqueued"
    assert not tally.wrong, (
        f"answers other than 2xx, 4xx or 503 with Retry-After: {tally.wrong[:10]} ({summary})"
    )
    rows = await job_rows(clean_db)
    assert sorted(rows) == sorted(tally.enqueued.values()), "a job was lost or doubled"
    assert {row["status"] for row in rows.values()} == {"succeeded"}
    # Each job finished under exactly one lease: its result is its own.
    for key, job_id in tally.enqueued.items():
        assert rows[job_id]["result"] == {"key": key}, rows[job_id]
    assert set(tally.completed) == set(rows), "a completion acknowledged nothing or too much"
