"""Failover to a streaming standby under load: jobq finds the new primary by itself and loses nothing.

Two ``jobq serve`` instances get a DATABASE_URL listing the primary and the standby with
``target_session_attrs=read-write``. Producers enqueue numbered jobs (each with an idempotency
key, retried until acknowledged) and consumers claim and complete them through both instances.
Mid-run the primary dies (``pg_ctl stop -m immediate``) and the standby is promoted. Replication
is synchronous, so every acknowledged commit is on the standby: every acknowledged job must exist
and be completed under exactly one lease. Afterwards the instances must be ready again, a parked
long-poll claim must be woken through the other instance (LISTEN re-established) and the reaper
must run (the leader lock re-taken).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import asyncpg
import httpx
import pytest

from app.migrations import upgrade
from tests.acceptance.helpers import claim
from tests.polling import poll_until
from tests.processes import JobqServer, JobqServers, free_port
from tests.system.failover.cluster import ReplicatedPair

pytestmark = pytest.mark.acceptance

QUEUE = "failover"
PRODUCERS = 2
CONSUMERS = 4
MAX_JOBS = 5
# Short leases: jobs whose completion was lost in the failover come back soon through the reaper.
LEASE_SECONDS = 3
REQUEST_TIMEOUT_SECONDS = 5.0
ENQUEUED_BEFORE_FAILOVER = 150
ENQUEUED_AFTER_FAILOVER = 150
PROMOTE_AFTER_SECONDS = 2.0
RECOVERY_WITHIN_SECONDS = 45.0
DRAIN_WITHIN_SECONDS = 60.0
RETRY_PAUSE_SECONDS = 0.05  # between attempts of a request that failed: pacing, not waiting
SERVER_ENV = {
    "JOBQ_REAPER_INTERVAL_SECONDS": "0.2",
    "JOBQ_ELECTION_INTERVAL_SECONDS": "0.5",
    "JOBQ_DB_POOL_TIMEOUT_SECONDS": "3",
    # Each listed host gets this long; a dead one (no answer) then costs each new connection that.
    "JOBQ_DB_CONNECT_TIMEOUT_SECONDS": "1",
    # So slow that only a notification wakes a parked claim in time.
    "JOBQ_LONGPOLL_BACKSTOP_SECONDS": "20",
}
WAKE_WITHIN_SECONDS = 5.0


@pytest.fixture
async def pair() -> AsyncIterator[ReplicatedPair]:
    """A primary and a synchronous standby, the ``jobq`` database migrated and replicated."""
    cluster = ReplicatedPair(free_port(), free_port())
    try:
        await asyncio.to_thread(cluster.create)
        admin = await asyncpg.connect(cluster.url(cluster.primary))
        try:
            await admin.execute("CREATE DATABASE jobq")
        finally:
            await admin.close()
        await asyncio.to_thread(upgrade, cluster.url(cluster.primary, "jobq"))

        async def synchronous() -> bool:
            conn = await asyncpg.connect(cluster.url(cluster.primary))
            try:
                state = await conn.fetchval("SELECT sync_state FROM pg_stat_replication LIMIT 1")
            finally:
                await conn.close()
            return bool(state == "sync")

        await poll_until(synchronous, within=30, what="the standby to replicate synchronously")
        yield cluster
    finally:
        await asyncio.to_thread(cluster.destroy)


@dataclass
class Tally:
    """What producers and consumers saw."""

    enqueued: dict[int, int] = field(default_factory=dict)  # job number -> acknowledged job id
    completed: dict[int, set[str]] = field(default_factory=dict)  # job id -> acknowledged leases
    errors: Counter[str] = field(default_factory=Counter)
    errors_after_stop: int = 0
    stopping: bool = False
    stopped_at: float | None = None  # when the primary was gone (its stop command returned)
    first_claim_after_stop: float | None = None
    replays: int = 0

    def error(self, what: str) -> None:
        self.errors[what] += 1
        if self.stopping:
            self.errors_after_stop += 1


async def _post(
    client: httpx.AsyncClient, path: str, body: dict[str, Any], tally: Tally
) -> httpx.Response | None:
    """A POST; answers ``None`` (and counts it) when the service or its database is away."""
    try:
        r = await client.post(path, json=body)
    except httpx.TransportError as exc:
        tally.error(f"{path} {type(exc).__name__}")
        return None
    if r.status_code >= 500:
        tally.error(f"{path} {r.status_code} {r.json().get('detail', '')[:80]}")
        return None
    return r


async def producer(
    clients: list[httpx.AsyncClient], numbers: range, stop: asyncio.Event, tally: Tally
) -> None:
    """Enqueues each numbered job, retrying with its idempotency key until acknowledged."""
    for n in numbers:
        attempt = 0
        while n not in tally.enqueued:
            if stop.is_set():
                return
            client = clients[(n + attempt) % len(clients)]
            attempt += 1
            body = {"queue": QUEUE, "type": "t", "payload": {"n": n}, "idempotency_key": f"n{n}"}
            r = await _post(client, "/v1/jobs", body, tally)
            if r is None:
                await asyncio.sleep(RETRY_PAUSE_SECONDS)
                continue
            assert r.status_code in (200, 201), r.text
            tally.enqueued[n] = r.json()["id"]


async def _complete(
    clients: list[httpx.AsyncClient], job: dict[str, Any], worker: str, tally: Tally
) -> None:
    """Completes one lease; a failed call is repeated with the same lease until it is answered."""
    body = {
        "worker_id": worker,
        "leases": [{"job_id": job["id"], "lease_id": job["lease_id"], "result": {"lease": job["lease_id"]}}],
    }  # fmt: skip
    deadline = time.monotonic() + DRAIN_WITHIN_SECONDS
    for attempt in range(10_000):
        r = await _post(clients[attempt % len(clients)], "/v1/complete", body, tally)
        if r is not None:
            assert r.status_code == 200, r.text
            [result] = r.json()["results"]
            if result["ok"]:
                assert result["status"] == "succeeded", result
                tally.completed.setdefault(job["id"], set()).add(job["lease_id"])
                tally.replays += attempt > 0
            return
        if time.monotonic() > deadline:
            return
        await asyncio.sleep(RETRY_PAUSE_SECONDS)


async def consumer(
    clients: list[httpx.AsyncClient], worker: str, stop: asyncio.Event, tally: Tally
) -> None:
    """Claims and completes jobs through both instances until ``stop``."""
    turn = 0
    while not stop.is_set():
        client = clients[turn % len(clients)]
        turn += 1
        body = {
            "worker_id": worker,
            "queues": [QUEUE],
            "max_jobs": MAX_JOBS,
            "lease_seconds": LEASE_SECONDS,
            "wait_seconds": 0.5,
        }
        sent = time.monotonic()
        r = await _post(client, "/v1/claim", body, tally)
        if r is None:
            await asyncio.sleep(RETRY_PAUSE_SECONDS)
            continue
        assert r.status_code == 200, r.text
        stopped = tally.stopped_at
        if stopped is not None and sent > stopped and tally.first_claim_after_stop is None:
            tally.first_claim_after_stop = time.monotonic()
        for job in r.json()["jobs"]:
            await _complete(clients, job, worker, tally)


async def _count_at_least(tally: Tally, count: int) -> None:
    await poll_until(lambda: len(tally.enqueued) >= count, within=60, what=f"{count} enqueues")


def _ready(server: JobqServer) -> Callable[[], Awaitable[bool]]:
    async def ready() -> bool:
        try:
            async with httpx.AsyncClient(base_url=server.url, timeout=2) as c:
                return (await c.get("/readyz")).status_code == 200
        except httpx.TransportError:
            return False

    return ready


@contextlib.contextmanager
def _black_hole(port: int) -> Iterator[None]:
    """A listener on ``port`` that never accepts: connections to it hang, as to a dead machine."""
    with socket.socket() as hole:
        hole.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        hole.bind(("127.0.0.1", port))
        hole.listen(1)
        yield


@pytest.mark.parametrize("old_primary", ["refuses", "hangs"])
async def test_failover_to_promoted_standby(
    pair: ReplicatedPair, jobq_servers: JobqServers, record_property: Any, old_primary: str
) -> None:
    """Kills the primary mid-run, promotes the standby; jobq recovers, every ack holds.

    ``refuses``: the old primary's port refuses connections (its server died, its machine
    lives). ``hangs``: connections to it get no answer at all (its machine died), so only the
    per-host connect timeout gets jobq on to the second host.
    """
    hosts = f"127.0.0.1:{pair.primary.port},127.0.0.1:{pair.standby.port}"
    jobq_servers.database_url = (
        f"postgresql://postgres@{hosts}/jobq?target_session_attrs=read-write"
    )
    first = await jobq_servers.start(SERVER_ENV)
    second = await jobq_servers.start(SERVER_ENV)
    tally = Tally()
    stop_producing, stop_consuming = asyncio.Event(), asyncio.Event()
    total = ENQUEUED_BEFORE_FAILOVER + ENQUEUED_AFTER_FAILOVER + 10_000
    timeout = httpx.Timeout(REQUEST_TIMEOUT_SECONDS)
    async with (
        httpx.AsyncClient(base_url=first.url, timeout=timeout) as a,
        httpx.AsyncClient(base_url=second.url, timeout=timeout) as b,
    ):
        clients = [a, b]
        producers = [
            asyncio.create_task(
                producer(clients, range(p, total, PRODUCERS), stop_producing, tally)
            )
            for p in range(PRODUCERS)
        ]
        consumers = [
            asyncio.create_task(consumer(clients, f"w{c}", stop_consuming, tally))
            for c in range(CONSUMERS)
        ]
        tasks = [*producers, *consumers]
        dead_machine = contextlib.ExitStack()
        try:
            await _count_at_least(tally, ENQUEUED_BEFORE_FAILOVER)
            assert not tally.errors, tally.errors

            tally.stopping = True
            await asyncio.to_thread(pair.stop_immediately, pair.primary)
            if old_primary == "hangs":
                dead_machine.enter_context(_black_hole(pair.primary.port))
            tally.stopped_at = time.monotonic()
            # Not synchronisation: the time a failure detector takes before it promotes, during
            # which only a read-only standby answers (jobq must refuse it and keep trying).
            await asyncio.sleep(PROMOTE_AFTER_SECONDS)
            await asyncio.to_thread(pair.promote, pair.standby)
            promoted = time.monotonic() - tally.stopped_at
            acked_at_stop = len(tally.enqueued)

            await poll_until(
                lambda: tally.first_claim_after_stop is not None,
                within=RECOVERY_WITHIN_SECONDS,
                what="a claim to succeed after the failover",
            )
            assert tally.first_claim_after_stop is not None
            recovery = tally.first_claim_after_stop - tally.stopped_at
            await _count_at_least(tally, acked_at_stop + ENQUEUED_AFTER_FAILOVER)
            stop_producing.set()
            await asyncio.gather(*producers)
            await poll_until(
                lambda: set(tally.enqueued.values()) <= set(tally.completed),
                within=DRAIN_WITHIN_SECONDS,
                what="every acknowledged job to be completed",
            )
        finally:
            stop_producing.set()
            stop_consuming.set()
            await asyncio.gather(*tasks, return_exceptions=True)
            dead_machine.close()
        for task in tasks:
            failure = task.exception()
            if failure is not None:
                raise failure

        print(
            f"\nfailover ({old_primary}): promotion done {promoted:.2f} s after the primary "
            f"stopped; first successful claim {recovery:.2f} s after it; "
            f"{tally.errors_after_stop} failed "
            f"requests meanwhile; {tally.replays} completions answered as replays; "
            f"{len(tally.enqueued)} jobs acknowledged"
        )
        print("failed requests by kind:", dict(tally.errors))
        record_property(f"failover_{old_primary}_first_claim_seconds", round(recovery, 3))
        assert not [kind for kind in tally.errors if " 500 " in kind], tally.errors
        assert tally.errors_after_stop > 0, "no request failed: the failover did not happen"

        # Nothing acknowledged is lost, nothing is completed under two leases.
        doubled = {job: leases for job, leases in tally.completed.items() if len(leases) > 1}
        assert not doubled, f"jobs completed under two acknowledged leases: {doubled}"
        conn = await asyncpg.connect(pair.url(pair.standby, "jobq"))
        try:
            rows = await conn.fetch(
                "SELECT id, status, (payload->>'n')::int AS n, result->>'lease' AS lease "
                "FROM jobs WHERE queue = $1",
                QUEUE,
            )
        finally:
            await conn.close()
        by_id = {row["id"]: row for row in rows}
        numbers = Counter(row["n"] for row in rows)
        assert [n for n, times in numbers.items() if times > 1] == []
        for n, job_id in tally.enqueued.items():
            row = by_id.get(job_id)
            assert row is not None, f"acknowledged job {job_id} (n={n}) is lost"
            assert row["n"] == n and row["status"] == "succeeded", dict(row)
            assert {row["lease"]} == tally.completed[job_id], (dict(row), tally.completed[job_id])

        # Both instances are ready again, the leader lock is held once, LISTEN works again.
        for server in (first, second):
            await poll_until(_ready(server), within=30, what=f"{server.name} ready")

        async def one_leader() -> bool:
            scrapes = [(await c.get("/metrics")).text for c in clients]
            return sum("jobq_leader 1.0" in s for s in scrapes) == 1

        await poll_until(one_leader, within=15, what="exactly one leader after the failover")
        await _woken_across(a, b)
        await _reaped(a, b)


async def _woken_across(a: httpx.AsyncClient, b: httpx.AsyncClient) -> None:
    """A claim parked on ``b`` is woken by an enqueue through ``a`` (a notification, not the backstop)."""
    parked = asyncio.create_task(claim(b, "waiter", "lp", max_jobs=1, wait_seconds=15))

    async def is_parked() -> bool:
        return "jobq_claims_waiting 1.0" in (await b.get("/metrics")).text

    await poll_until(is_parked, within=10, what="the claim to park")
    r = await a.post("/v1/jobs", json={"queue": "lp", "type": "t", "payload": {}})
    assert r.status_code == 201, r.text
    [woken] = await asyncio.wait_for(parked, WAKE_WITHIN_SECONDS)
    assert woken["id"] == r.json()["id"]


async def _reaped(a: httpx.AsyncClient, b: httpx.AsyncClient) -> None:
    """A lease that expires after the failover is reaped (the leader's loops run)."""
    r = await a.post("/v1/jobs", json={"queue": "reap", "type": "t", "payload": {}})
    assert r.status_code == 201, r.text
    [held] = await claim(b, "sleeper", "reap", max_jobs=1, lease_seconds=1)

    async def pending_again() -> bool:
        job = (await a.get(f"/v1/jobs/{held['id']}")).json()
        return bool(job["status"] == "pending")

    await poll_until(pending_again, within=15, what="the reaper to return the expired lease")
