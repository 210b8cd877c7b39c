"""The HTTP workloads the load process (``python -m bench.load``) runs against `jobq serve`.

Each simulated client owns one keep-alive connection (``bench/http.py``); with several
instances (``python -m bench --instances 2``) client ``i`` talks to instance ``i % K``. Every
workload opens its connections before its timed section, records what it sent and got (job ids,
HTTP errors) for ``python -m bench`` to verify against the database, and marks the timed section
with the :class:`~bench.common.Meter` it is given. With ``api_key`` in its arguments every request
of every workload sends ``Authorization: Bearer <api_key>``.

- :func:`enqueue`: N jobs by ``POST /v1/jobs`` (batch 1) or ``POST /v1/jobs/batch``, C clients;
- :func:`drain`: W workers loop claim (``max_jobs``) then complete until the queue is empty;
- :func:`latency`: enqueue response to claim response with idle long-pollers (``wait_seconds`` 20);
- :func:`claim_latency`: one ``POST /v1/claim`` (max_jobs 1) at a time on a small backlog;
- :func:`lease_latency`: one client claims (max_jobs 1) then completes, each request timed;
- :func:`soak`: producers and workers for a while, then a drain of what is left.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

from bench.common import JOB_TYPE, LEASE_SECONDS, Counter, Errors, Meter
from bench.http import Connection, HttpError, Response


def connections(args: dict[str, Any], n: int) -> list[Connection]:
    """``n`` connections, spread round-robin over the instances (``bases``), sending ``api_key``."""
    bases: Sequence[str] = args["bases"]
    key: str | None = args.get("api_key")
    headers = {"Authorization": f"Bearer {key}"} if key else None
    return [Connection(bases[i % len(bases)], headers=headers) for i in range(n)]


async def open_all(conns: Sequence[Connection]) -> None:
    """Opens every connection with a ``GET /healthz``, so no timed request pays a TCP handshake."""
    await asyncio.gather(*(conn.get("/healthz") for conn in conns))


async def close_all(conns: Sequence[Connection]) -> None:
    """Closes every connection."""
    await asyncio.gather(*(conn.close() for conn in conns))


def job(queue: str, n: int, keys: int = 0) -> dict[str, Any]:
    """The enqueue body of job number ``n`` (with one of ``keys`` concurrency keys when > 0)."""
    body: dict[str, Any] = {"queue": queue, "type": JOB_TYPE, "payload": {"n": n}}
    if keys:
        body["concurrency_key"] = f"bench-key:{n % keys}"
    return body


def refused(what: str, response: Response) -> str:
    """An error line for an unexpected answer."""
    return f"{what}: HTTP {response.status}: {response.body[:300].decode(errors='replace')}"


async def post(
    conn: Connection, path: str, body: Any, errors: Errors, *, time_limit: float | None = None
) -> Response | None:
    """``POST``; a broken connection is counted as an error and answered with None."""
    try:
        return await conn.post(path, body, time_limit=time_limit)
    except HttpError as exc:
        errors.add(f"POST {path}: {exc}")
        return None


async def enqueue(args: dict[str, Any], meter: Meter, errors: Errors) -> dict[str, Any]:
    """Enqueues ``jobs`` jobs from ``clients`` clients, ``batch`` per request (1: ``POST /v1/jobs``)."""
    queue, batch, keys = args["queue"], int(args["batch"]), int(args.get("keys", 0))
    lean = args.get("answer", "jobs") == "ids"  # ?answer=ids: only the ids come back
    batch_path = "/v1/jobs/batch?answer=ids" if lean else "/v1/jobs/batch"
    numbers = Counter(int(args["jobs"]))
    conns = connections(args, int(args["clients"]))
    created: list[int] = []
    requests = 0

    async def client(conn: Connection) -> None:
        nonlocal requests
        while chunk := numbers.take(batch):
            if batch == 1:
                response = await post(conn, "/v1/jobs", job(queue, chunk[0], keys), errors)
            else:
                body = {"jobs": [job(queue, n, keys) for n in chunk]}
                response = await post(conn, batch_path, body, errors)
            requests += 1
            if response is None:
                continue
            if response.status != 201:
                errors.add(refused("enqueue", response))
                continue
            answer = response.json()
            if batch == 1:
                created.append(answer["id"])
            elif lean:
                created.extend(answer["ids"])
            else:
                created.extend(item["id"] for item in answer["jobs"])

    await open_all(conns)
    meter.start()
    await asyncio.gather(*(client(conn) for conn in conns))
    meter.stop()
    await close_all(conns)
    return {
        "jobs": numbers.next,
        "requests": requests,
        "created": len(created),
        "created_unique": len(set(created)),
    }


async def drain(args: dict[str, Any], meter: Meter, errors: Errors) -> dict[str, Any]:
    """``workers`` workers claim ``max_jobs`` at a time and complete them until a claim comes back empty.

    Each complete carries ``claim_next`` (the same claim), so a worker makes one request per
    batch of jobs after its first claim, as ``jobq_client``'s Worker does. A worker stops at its
    first empty claim: every job still pending then is held by another
    worker, which completes it. The timed section ends when the last worker stops.
    """
    queue, max_jobs = args["queue"], int(args["max_jobs"])
    wait_seconds = float(args.get("wait_seconds", 0))
    conns = connections(args, int(args["workers"]))
    completed: list[int] = []
    requests = 0

    async def worker(index: int, conn: Connection) -> None:
        nonlocal requests
        worker_id = f"bench-drain-{index}"
        claim = {
            "worker_id": worker_id,
            "queues": [queue],
            "max_jobs": max_jobs,
            "lease_seconds": LEASE_SECONDS,
            "wait_seconds": wait_seconds,
        }
        response = await post(conn, "/v1/claim", claim, errors)
        requests += 1
        if response is None or response.status != 200:
            if response is not None:
                errors.add(refused("claim", response))
            return
        jobs = response.json()["jobs"]
        # Each complete asks for the worker's next jobs (claim_next): one request per batch.
        claim_next = {k: v for k, v in claim.items() if k != "worker_id"}
        while jobs:
            leases = [{"job_id": j["id"], "lease_id": j["lease_id"]} for j in jobs]
            body = {"worker_id": worker_id, "leases": leases, "claim_next": claim_next}
            response = await post(conn, "/v1/complete", body, errors)
            requests += 1
            if response is None or response.status != 200:
                if response is not None:
                    errors.add(refused("complete", response))
                return
            answer = response.json()
            for item in answer["results"]:
                if item["ok"] and item["status"] == "succeeded":
                    completed.append(item["job_id"])
                else:
                    errors.add(f"complete answered {item}")
            if answer.get("claim_error") is not None:
                errors.add(f"claim_next answered {answer['claim_error']}")
                return
            jobs = answer["claimed"]["jobs"]

    await open_all(conns)
    meter.start()
    await asyncio.gather(*(worker(i, conn) for i, conn in enumerate(conns)))
    meter.stop()
    await close_all(conns)
    return {"jobs": len(completed), "requests": requests, "completed_ids": completed}


async def latency(args: dict[str, Any], meter: Meter, errors: Errors) -> dict[str, Any]:
    """Enqueues one job every ``interval_seconds`` and times enqueue response to claim response.

    ``pollers`` idle workers long-poll (``wait_seconds`` 20, max_jobs 1) and complete what they
    get; the next job is enqueued once the previous one was claimed and the interval has passed.
    A sample can be slightly negative: the claim may answer before the enqueue's response is read.
    """
    queue, jobs = args["queue"], int(args["jobs"])
    interval, timeout = float(args["interval_seconds"]), float(args.get("timeout_seconds", 10))
    pollers = connections(args, int(args["pollers"]))
    producers = connections(args, len(args["bases"]))
    claimed: dict[int, float] = {}
    arrived: dict[int, asyncio.Future[None]] = {}
    loop = asyncio.get_running_loop()

    async def poller(index: int, conn: Connection) -> None:
        worker_id = f"bench-poller-{index}"
        claim = {"worker_id": worker_id, "queues": [queue], "max_jobs": 1, "wait_seconds": 20}
        while True:
            response = await post(conn, "/v1/claim", claim, errors, time_limit=40)
            at = time.perf_counter()
            if response is None or response.status != 200:
                if response is not None:
                    errors.add(refused("long-poll claim", response))
                await asyncio.sleep(0.5)
                continue
            for item in response.json()["jobs"]:
                claimed[item["id"]] = at
                future = arrived.setdefault(item["id"], loop.create_future())
                if not future.done():
                    future.set_result(None)
                lease = {"job_id": item["id"], "lease_id": item["lease_id"]}
                done = await post(
                    conn, "/v1/complete", {"worker_id": worker_id, "leases": [lease]}, errors
                )
                if done is not None and done.status != 200:
                    errors.add(refused("complete", done))

    await open_all([*pollers, *producers])
    tasks = [asyncio.create_task(poller(i, conn)) for i, conn in enumerate(pollers)]
    await asyncio.sleep(0.5)  # let every poller park before the first job
    samples: list[float] = []
    meter.start()
    for n in range(jobs):
        next_at = time.perf_counter() + interval
        response = await post(producers[n % len(producers)], "/v1/jobs", job(queue, n), errors)
        sent = time.perf_counter()
        if response is None or response.status != 201:
            if response is not None:
                errors.add(refused("enqueue", response))
            continue
        job_id = response.json()["id"]
        future = arrived.setdefault(job_id, loop.create_future())
        try:
            await asyncio.wait_for(future, timeout)
        except TimeoutError:
            errors.add(f"job {job_id} not claimed by a long-poller within {timeout} s")
            continue
        samples.append((claimed[job_id] - sent) * 1000)
        await asyncio.sleep(max(0.0, next_at - time.perf_counter()))
    meter.stop()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await close_all([*pollers, *producers])
    return {"jobs": jobs, "requests": 3 * jobs, "latencies_ms": samples}


async def claim_latency(args: dict[str, Any], meter: Meter, errors: Errors) -> dict[str, Any]:
    """Times ``samples`` single claims (max_jobs 1), one at a time, on a backlog of ``backlog`` jobs.

    With ``preload`` the backlog is enqueued first; after each timed claim the job is completed
    and one new job enqueued (neither timed), so the backlog stays the same size.
    """
    queue, samples_wanted = args["queue"], int(args["samples"])
    conns = connections(args, len(args["bases"]))
    await open_all(conns)
    preload = int(args.get("preload", 0))
    if preload:
        body = {"jobs": [job(queue, n) for n in range(preload)]}
        response = await post(conns[0], "/v1/jobs/batch", body, errors)
        if response is None or response.status != 201:
            if response is not None:
                errors.add(refused("backlog enqueue", response))
            return {"jobs": 0, "requests": 0, "latencies_ms": []}
    worker_id = "bench-claim-latency"
    claim = {"worker_id": worker_id, "queues": [queue], "max_jobs": 1}
    samples: list[float] = []
    meter.start()
    for n in range(samples_wanted):
        conn = conns[n % len(conns)]
        started = time.perf_counter()
        response = await post(conn, "/v1/claim", claim, errors)
        elapsed = (time.perf_counter() - started) * 1000
        if response is None or response.status != 200:
            if response is not None:
                errors.add(refused("claim", response))
            continue
        jobs = response.json()["jobs"]
        if len(jobs) != 1:
            errors.add(f"claim on a backlog answered {len(jobs)} jobs, not 1")
            continue
        samples.append(elapsed)
        lease = {"job_id": jobs[0]["id"], "lease_id": jobs[0]["lease_id"]}
        done = await post(conn, "/v1/complete", {"worker_id": worker_id, "leases": [lease]}, errors)
        if done is not None and done.status != 200:
            errors.add(refused("complete", done))
        more = await post(conn, "/v1/jobs", job(queue, preload + n), errors)
        if more is not None and more.status != 201:
            errors.add(refused("enqueue", more))
    meter.stop()
    await close_all(conns)
    # Each sample is one timed claim plus an untimed complete and enqueue.
    return {"jobs": len(samples), "requests": 3 * len(samples), "latencies_ms": samples}


async def lease_latency(args: dict[str, Any], meter: Meter, errors: Errors) -> dict[str, Any]:
    """One client claims one job (max_jobs 1) then completes it, ``jobs`` times; times each request.

    The jobs are pre-loaded. Requests go one at a time, job ``n`` to instance ``n % K`` (claim
    and complete on the same connection); the claim and the complete latencies are recorded
    separately. Stops early at an empty claim (the pre-load was short: the check will say so).
    """
    queue, jobs = args["queue"], int(args["jobs"])
    conns = connections(args, len(args["bases"]))
    await open_all(conns)
    worker_id = "bench-lease-latency"
    claim = {
        "worker_id": worker_id,
        "queues": [queue],
        "max_jobs": 1,
        "lease_seconds": LEASE_SECONDS,
        "wait_seconds": 0,
    }
    claim_ms: list[float] = []
    complete_ms: list[float] = []
    completed: list[int] = []
    requests = 0
    meter.start()
    for n in range(jobs):
        conn = conns[n % len(conns)]
        started = time.perf_counter()
        response = await post(conn, "/v1/claim", claim, errors)
        elapsed = (time.perf_counter() - started) * 1000
        requests += 1
        if response is None or response.status != 200:
            if response is not None:
                errors.add(refused("claim", response))
            continue
        claimed = response.json()["jobs"]
        if len(claimed) != 1:
            errors.add(f"claim {n + 1} of {jobs} answered {len(claimed)} jobs, not 1")
            break
        claim_ms.append(elapsed)
        lease = {"job_id": claimed[0]["id"], "lease_id": claimed[0]["lease_id"]}
        body = {"worker_id": worker_id, "leases": [lease]}
        started = time.perf_counter()
        done = await post(conn, "/v1/complete", body, errors)
        elapsed = (time.perf_counter() - started) * 1000
        requests += 1
        if done is None or done.status != 200:
            if done is not None:
                errors.add(refused("complete", done))
            continue
        complete_ms.append(elapsed)
        for item in done.json()["results"]:
            if item["ok"] and item["status"] == "succeeded":
                completed.append(item["job_id"])
            else:
                errors.add(f"complete answered {item}")
    meter.stop()
    await close_all(conns)
    return {
        "jobs": len(completed),
        "requests": requests,
        "completed_ids": completed,
        "claim_latencies_ms": claim_ms,
        "complete_latencies_ms": complete_ms,
    }


async def soak(args: dict[str, Any], meter: Meter, errors: Errors) -> dict[str, Any]:
    """Producers enqueue single jobs for ``seconds`` while workers claim and complete; then drain.

    Workers claim up to ``max_jobs`` with a 1 s long-poll. Once the producers stop, the workers
    go on until every enqueued job is completed (or ``drain_timeout_seconds`` passed).
    """
    queue, seconds = args["queue"], float(args["seconds"])
    max_jobs = int(args.get("max_jobs", 10))
    drain_timeout = float(args.get("drain_timeout_seconds", 60))
    producer_conns = connections(args, int(args["producers"]))
    worker_conns = connections(args, int(args["workers"]))
    enqueued: list[int] = []
    completed: list[int] = []
    requests = 0
    producing = True
    numbers = Counter(10**12)

    async def producer(conn: Connection) -> None:
        nonlocal requests
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            (n,) = numbers.take(1)
            response = await post(conn, "/v1/jobs", job(queue, n), errors)
            requests += 1
            if response is not None and response.status == 201:
                enqueued.append(response.json()["id"])
            elif response is not None:
                errors.add(refused("enqueue", response))

    async def worker(index: int, conn: Connection) -> None:
        nonlocal requests
        worker_id = f"bench-soak-{index}"
        claim = {"worker_id": worker_id, "queues": [queue], "max_jobs": max_jobs}
        drain_deadline = float("inf")
        while producing or len(completed) < len(enqueued):
            if not producing and drain_deadline == float("inf"):
                drain_deadline = time.perf_counter() + drain_timeout
            if time.perf_counter() > drain_deadline:
                errors.add(f"soak drain: {len(enqueued) - len(completed)} jobs left after timeout")
                return
            response = await post(conn, "/v1/claim", {**claim, "wait_seconds": 1}, errors)
            requests += 1
            if response is None or response.status != 200:
                if response is not None:
                    errors.add(refused("claim", response))
                await asyncio.sleep(0.1)
                continue
            jobs = response.json()["jobs"]
            if not jobs:
                continue
            leases = [{"job_id": j["id"], "lease_id": j["lease_id"]} for j in jobs]
            done = await post(
                conn, "/v1/complete", {"worker_id": worker_id, "leases": leases}, errors
            )
            requests += 1
            if done is None or done.status != 200:
                if done is not None:
                    errors.add(refused("complete", done))
                continue
            for item in done.json()["results"]:
                if item["ok"] and item["status"] == "succeeded":
                    completed.append(item["job_id"])
                else:
                    errors.add(f"complete answered {item}")

    await open_all([*producer_conns, *worker_conns])
    meter.start()
    workers = [asyncio.create_task(worker(i, c)) for i, c in enumerate(worker_conns)]
    await asyncio.gather(*(producer(c) for c in producer_conns))
    producing = False
    produced_at = time.perf_counter()
    await asyncio.gather(*workers)
    meter.stop()
    drain_seconds = time.perf_counter() - produced_at
    await close_all([*producer_conns, *worker_conns])
    return {
        "jobs": len(completed),
        "requests": requests,
        "enqueued_ids": enqueued,
        "completed_ids": completed,
        "drain_seconds": drain_seconds,
    }
