"""Long-poll benchmark: enqueue->claim latency, 200 parked claims, and the cost of wake-ups.

    python bench/longpoll.py                 # embedded PostgreSQL
    DATABASE_URL=postgresql://postgres@127.0.0.1:5432/test python bench/longpoll.py

Runs real `jobq serve` processes. Prints:
1. enqueue->claim latency (enqueue response to claim response) with one idle long-polling worker
   per queue, same instance and across two instances (LISTEN/NOTIFY);
2. with 200 long-polls parked: PostgreSQL backends used by the instance, and enqueue latency p99
   with and without them;
3. 16 concurrent single enqueues per second with wake-ups on and off, against a raw-SQL
   baseline (16 asyncpg connections inserting the same rows) in the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import statistics
import time
from typing import Any

import asyncpg
import httpx

from bench.harness import count_backends, database, jobq_serve, percentile, raw_dsn, summary

QUEUES = ["q0", "q1", "q2", "q3"]
POOL_SIZE = 10


async def latency(producer_base: str, worker_base: str, jobs: int) -> list[float]:
    """Per job: ms from the enqueue response to the claim response of an idle long-poller."""
    got: dict[int, float] = {}
    arrived = {q: asyncio.Event() for q in QUEUES}
    stop = asyncio.Event()

    async def worker(queue: str, client: httpx.AsyncClient) -> None:
        while not stop.is_set():
            r = await client.post(
                "/v1/claim",
                json={"worker_id": f"bench-{queue}", "queues": [queue], "wait_seconds": 5},
            )
            at = time.perf_counter()
            for job in r.json()["jobs"]:
                got[job["id"]] = at
                await client.post(
                    "/v1/complete",
                    json={
                        "worker_id": f"bench-{queue}",
                        "leases": [{"job_id": job["id"], "lease_id": job["lease_id"]}],
                    },
                )
                arrived[queue].set()

    limits = httpx.Limits(max_connections=20)
    async with (
        httpx.AsyncClient(base_url=worker_base, timeout=30, limits=limits) as wc,
        httpx.AsyncClient(base_url=producer_base, timeout=30) as pc,
    ):
        workers = [asyncio.create_task(worker(q, wc)) for q in QUEUES]
        await asyncio.sleep(0.5)  # let every worker park before the first job
        samples: list[float] = []
        for i, queue in zip(range(jobs), itertools.cycle(QUEUES), strict=False):
            arrived[queue].clear()
            r = await pc.post("/v1/jobs", json={"queue": queue, "type": "bench", "payload": i})
            sent = time.perf_counter()
            job_id = r.json()["id"]
            await asyncio.wait_for(arrived[queue].wait(), 10)
            samples.append((got[job_id] - sent) * 1000)
        stop.set()
        await asyncio.gather(*workers)
    return samples


async def enqueue_latency(base: str, n: int) -> list[float]:
    samples = []
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        for i in range(n):
            started = time.perf_counter()
            await client.post("/v1/jobs", json={"queue": "busy", "type": "bench", "payload": i})
            samples.append((time.perf_counter() - started) * 1000)
    return samples


async def parked_claims(url: str, base: str, n: int) -> tuple[int, list[float], list[float]]:
    """Backends with n long-polls parked; enqueue latency without and with them."""
    without = await enqueue_latency(base, 500)
    limits = httpx.Limits(max_connections=n + 10)
    async with httpx.AsyncClient(base_url=base, timeout=60, limits=limits) as client:
        parked = [
            asyncio.create_task(
                client.post(
                    "/v1/claim",
                    json={"worker_id": f"idle-{i}", "queues": ["idle"], "wait_seconds": 20},
                )
            )
            for i in range(n)
        ]
        await asyncio.sleep(2)  # let them all park
        backends = await count_backends(url, ["jobq", "jobq-control"])
        with_parked = await enqueue_latency(base, 500)
        for task in parked:
            task.cancel()
        await asyncio.gather(*parked, return_exceptions=True)
    return backends, without, with_parked


async def http_enqueue_rate(base: str, clients: int, seconds: float) -> float:
    """Single-job enqueues per second from ``clients`` concurrent HTTP clients."""
    done = 0
    deadline = time.perf_counter() + seconds

    async def client_loop(n: int, client: httpx.AsyncClient) -> None:
        nonlocal done
        i = 0
        while time.perf_counter() < deadline:
            await client.post(
                "/v1/jobs", json={"queue": f"rate{n % 4}", "type": "bench", "payload": i}
            )
            done += 1
            i += 1

    limits = httpx.Limits(max_connections=clients)
    async with httpx.AsyncClient(base_url=base, timeout=30, limits=limits) as client:
        started = time.perf_counter()
        await asyncio.gather(*(client_loop(n, client) for n in range(clients)))
        return done / (time.perf_counter() - started)


async def raw_sql_rate(url: str, clients: int, seconds: float) -> float:
    """The same inserts straight through asyncpg, one autocommit statement each."""
    conns = [await asyncpg.connect(raw_dsn(url)) for _ in range(clients)]
    done = 0
    deadline = time.perf_counter() + seconds

    async def loop(conn: Any, n: int) -> None:
        nonlocal done
        i = 0
        while time.perf_counter() < deadline:
            await conn.execute(
                "INSERT INTO jobs (queue, type, payload, max_attempts, lease_seconds) "
                "VALUES ($1, 'bench', $2::jsonb, 10, 30)",
                f"raw{n % 4}",
                str(i),
            )
            done += 1
            i += 1

    try:
        started = time.perf_counter()
        await asyncio.gather(*(loop(c, n) for n, c in enumerate(conns)))
        return done / (time.perf_counter() - started)
    finally:
        for c in conns:
            await c.close()


async def run(url: str, jobs: int, rounds: int, seconds: float) -> None:
    if True:
        env = {"JOBQ_DB_POOL_SIZE": str(POOL_SIZE), "JOBQ_DB_MAX_OVERFLOW": "0"}
        print(f"jobq long-poll benchmark: {jobs} jobs, pool size {POOL_SIZE}\n")
        async with jobq_serve(url, **env) as a, jobq_serve(url, **env) as b:
            same = await latency(a, a, jobs)
            print(f"1. enqueue->claim, same instance : {summary(same)}")
            cross = await latency(a, b, jobs)
            print(f"   enqueue->claim, other instance: {summary(cross)}")

        async with jobq_serve(url, **env) as a:
            backends, without, with_parked = await parked_claims(url, a, 200)
            p99_without, p99_with = percentile(without, 99), percentile(with_parked, 99)
            print(
                f"\n2. 200 parked long-polls: {backends} PostgreSQL backends "
                f"(pool size {POOL_SIZE} + 1 control connection = {POOL_SIZE + 1})"
            )
            print(f"   enqueue latency, none parked  : {summary(without)}")
            print(f"   enqueue latency, 200 parked   : {summary(with_parked)}")
            print(f"   p99 change: {100 * (p99_with - p99_without) / p99_without:+.1f} %")

        on_rates, off_rates, raw_rates = [], [], []
        async with (
            jobq_serve(url, **env) as on,
            jobq_serve(url, **env, JOBQ_WAKEUP_ANNOUNCE="false") as off,
        ):
            for _ in range(rounds):  # interleaved, so drift hits both alike
                on_rates.append(await http_enqueue_rate(on, 16, seconds))
                off_rates.append(await http_enqueue_rate(off, 16, seconds))
                raw_rates.append(await raw_sql_rate(url, 16, seconds))
        on_rate, off_rate = statistics.median(on_rates), statistics.median(off_rates)
        print(f"\n3. 16 concurrent single enqueues, median of {rounds} rounds of {seconds:.0f} s:")
        print(f"   raw SQL baseline (asyncpg INSERT) : {statistics.median(raw_rates):8.0f} /s")
        print(f"   jobq, wake-ups off                : {off_rate:8.0f} /s")
        print(f"   jobq, wake-ups on                 : {on_rate:8.0f} /s")
        print(
            f"   wake-up cost: {100 * (off_rate - on_rate) / off_rate:+.1f} % "
            "(positive = slower with wake-ups)"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0)
    args = parser.parse_args()
    with database() as url:
        asyncio.run(run(url, args.jobs, args.rounds, args.seconds))
