"""jobq.enqueue() in a producer's own transaction: what it costs the commit, how soon claims wake.

    python -m bench.sql_enqueue                                   # embedded PostgreSQL
    python -m bench.sql_enqueue --dsn postgresql://postgres@127.0.0.1:5432/test

On a fresh database, with one real `jobq serve` process:

1. The producer's transaction, timed from BEGIN to the end of COMMIT, by 1 and by 16 concurrent
   producers (asyncpg, one connection each): the business write alone (an INSERT into a small
   orders table, the raw baseline), with ``jobq.enqueue(..., wake => false)``, and with the
   default wake-up (``pg_notify`` at commit). Transactions per second and p50 / p99 ms.
2. Commit to claim: a worker long-polls ``/v1/claim`` on the instance; the producer commits a
   business write with ``jobq.enqueue()``; the time from the end of COMMIT to the claim's answer
   (p50 / p99 ms), with the wake-up, and without it (``wake => false``: the claim learns of the
   job from the instance's backstop, ``JOBQ_LONGPOLL_BACKSTOP_SECONDS``, 1 s by default).

Speed is reported, never asserted; every run checks that each job it made exists, once.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

import asyncpg
import httpx

from bench.harness import database, jobq_serve, percentile, raw_dsn

ORDERS = "CREATE TABLE bench_orders (id bigserial PRIMARY KEY, total numeric NOT NULL)"
BUSINESS = "INSERT INTO bench_orders (total) VALUES (42.5)"
VARIANTS = {
    "business write only (raw)": None,
    "+ jobq.enqueue(wake => false)": "SELECT jobq.enqueue('bench', 'receipt', $1::jsonb, wake => false)",
    "+ jobq.enqueue() (wakes claims)": "SELECT jobq.enqueue('bench', 'receipt', $1::jsonb)",
}


async def _producer(dsn: str, enqueue: str | None, count: int, out: list[float]) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        payload = json.dumps({"order": 1})
        for _ in range(count):
            started = time.perf_counter()
            async with conn.transaction():
                await conn.execute(BUSINESS)
                if enqueue is not None:
                    await conn.fetchval(enqueue, payload)
            out.append((time.perf_counter() - started) * 1000)
    finally:
        await conn.close()


async def commit_cost(dsn: str, producers: int, per_producer: int) -> None:
    print(f"\n{producers} producer(s) x {per_producer} transactions")
    print(f"{'transaction':<36} {'tx/s':>8} {'p50 ms':>8} {'p99 ms':>8}")
    for name, enqueue in VARIANTS.items():
        samples: list[float] = []
        started = time.perf_counter()
        await asyncio.gather(
            *(_producer(dsn, enqueue, per_producer, samples) for _ in range(producers))
        )
        rate = len(samples) / (time.perf_counter() - started)
        print(
            f"{name:<36} {rate:>8.0f} {percentile(samples, 50):>8.2f} "
            f"{percentile(samples, 99):>8.2f}"
        )


async def wake_latency(dsn: str, base: str, jobs: int, wake: bool) -> list[float]:
    """ms from the end of the producer's COMMIT to the long-polling claim's answer."""
    samples: list[float] = []
    conn = await asyncpg.connect(dsn)
    call = "SELECT jobq.enqueue('wake', 'receipt', $1::jsonb, wake => $2)"
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        for i in range(jobs):
            claim = asyncio.create_task(
                client.post(
                    "/v1/claim",
                    json={"worker_id": "bench", "queues": ["wake"], "wait_seconds": 10},
                )
            )
            await asyncio.sleep(0.05)  # parked before the commit
            async with conn.transaction():
                await conn.execute(BUSINESS)
                job_id = await conn.fetchval(call, json.dumps({"i": i}), wake)
            committed = time.perf_counter()
            answer = await claim
            arrived = time.perf_counter()
            [job] = answer.json()["jobs"]
            if job["id"] != job_id:
                raise SystemExit(f"check failed: claimed {job['id']}, enqueued {job_id}")
            samples.append((arrived - committed) * 1000)
            await client.post(
                "/v1/complete",
                json={
                    "worker_id": "bench",
                    "leases": [{"job_id": job_id, "lease_id": job["lease_id"]}],
                },
            )
    await conn.close()
    return samples


async def verify(dsn: str, expected: int) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        jobs = await conn.fetchval("SELECT count(*) FROM jobs")
        orders = await conn.fetchval("SELECT count(*) FROM bench_orders")
    finally:
        await conn.close()
    if jobs != expected:
        raise SystemExit(f"check failed: {jobs} jobs, expected {expected}")
    print(f"\nverified: {jobs} jobs, {orders} business rows")


async def run(url: str, transactions: int, wake_jobs: int) -> None:
    dsn = raw_dsn(url)
    conn = await asyncpg.connect(dsn)
    await conn.execute(ORDERS)
    server = await conn.fetchval("SHOW server_version")
    sync = await conn.fetchval("SHOW synchronous_commit")
    await conn.close()
    print(f"PostgreSQL {server}, synchronous_commit={sync}")
    await commit_cost(dsn, 1, transactions)
    await commit_cost(dsn, 16, max(1, transactions // 16))
    enqueued = 2 * (transactions + 16 * max(1, transactions // 16))
    async with jobq_serve(url) as base:
        print(f"\ncommit -> claim answer, {wake_jobs} jobs, one long-polling worker")
        print(f"{'producer':<36} {'p50 ms':>8} {'p99 ms':>8}")
        for wake in (True, False):
            samples = await wake_latency(dsn, base, wake_jobs, wake)
            name = "jobq.enqueue()" if wake else "jobq.enqueue(wake => false)"
            print(f"{name:<36} {percentile(samples, 50):>8.2f} {percentile(samples, 99):>8.2f}")
    await verify(dsn, enqueued + 2 * wake_jobs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", help="a PostgreSQL server (default: an embedded one)")
    parser.add_argument("--transactions", type=int, default=2000)
    parser.add_argument("--wake-jobs", type=int, default=50)
    args = parser.parse_args()
    with database(args.dsn) as url:
        asyncio.run(run(url, args.transactions, args.wake_jobs))


if __name__ == "__main__":
    main()
