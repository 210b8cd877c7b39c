"""The load process of ``python -m bench.workers``: one drain of a pre-loaded queue, then JSON.

    python -m bench.workers_load '<json args>'

Two ways to drain, each ``concurrency`` wide, each running a handler that does nothing
(``noop``) or awaits ``asyncio.sleep(0.001)`` (``sleep1ms``):

- ``bare``: ``concurrency`` asyncio tasks, each claims one job (``max_jobs`` 1, no wait), runs
  the handler and completes the job (two requests a job), through one shared
  ``httpx.AsyncClient`` whose pool holds a connection per task. A task stops at its first empty
  claim.
- ``lean``: the same loop over the bench's lean HTTP/1.1 client (``bench/http.py``: raw asyncio
  streams, a connection per task), the stand-in for a hand-written aiohttp loop: what a bare
  loop moves when its HTTP client costs next to nothing.
- ``worker``: ``jobq_client.Worker(concurrency=N)`` with the handler registered; the handler
  that runs the last pre-loaded job asks the worker to stop, and the run ends when ``run()``
  returns (every job settled).
- ``typescript``, ``go``: that client's ``Worker``, run by its contract driver
  (clients/CONTRACT.md, ``worker`` command, ``JOBQ_CONCURRENCY`` N; ``driver`` holds its argv)
  with the driver's ``noop`` / ``sleep1ms`` handler. The timed section runs from the driver's
  ``ready`` line until the database shows every pre-loaded job succeeded (polled every
  ``SETTLED_POLL_SECONDS`` through ``dsn``), then the driver gets SIGTERM and must exit 0. The
  client's CPU is the driver process's (``/proc``), not this process's.

The answer holds the ids the handlers ran (for the orchestrator's exactly-once check), the wall
seconds, this process's CPU seconds and the server's (``server_pids``) over the timed section.
With ``client`` (a folder holding a ``jobq_client`` package, an earlier commit's say) the Worker
is imported from there. With ``profile`` (a path) the timed section runs under cProfile and its stats go there.
"""

from __future__ import annotations

import asyncio
import contextlib
import cProfile
import json
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg
import httpx

from bench.common import LEASE_SECONDS, Errors, Meter
from bench.http import Connection, HttpError

HANDLERS = ("noop", "sleep1ms")
# "before": the Worker of another jobq_client (``client`` names its folder), run as "worker" is.
PYTHON_MODES = ("bare", "lean", "worker", "before")
# The other clients' Workers, through their drivers; "-before": an earlier commit's client
# (``--before-commit``) driven by this checkout's driver.
DRIVEN_MODES = ("typescript", "go", "typescript-before", "go-before")
MODES = PYTHON_MODES + DRIVEN_MODES
WORKER_MODES = ("worker", "before", *DRIVEN_MODES)  # what the table sets against the bare loops
SETTLED_POLL_SECONDS = 0.005
DRIVEN_LIMIT_SECONDS = 300.0
SETTLED = "SELECT count(*) FROM jobs WHERE queue = $1 AND status = 'succeeded'"


def work(handler: str) -> Callable[[], Awaitable[None]]:
    """The handler's body: nothing, or a 1 ms sleep."""

    async def noop() -> None:
        return None

    async def sleep1ms() -> None:
        await asyncio.sleep(0.001)

    return {"noop": noop, "sleep1ms": sleep1ms}[handler]


async def bare(args: dict[str, Any], meter: Meter, errors: Errors) -> list[int]:
    """``concurrency`` tasks of claim one, run, complete, over one shared httpx client."""
    base, queue, n = args["base"], args["queue"], int(args["concurrency"])
    body_of = work(args["handler"])
    done: list[int] = []
    # A connection per task, kept alive: what a loop this wide needs of httpx's pool.
    limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)
    async with httpx.AsyncClient(base_url=base, limits=limits, timeout=30.0) as http:
        await asyncio.gather(*(http.get("/healthz") for _ in range(n)))

        async def loop(index: int) -> None:
            worker_id = f"bench-bare-{index}"
            claim = {
                "worker_id": worker_id,
                "queues": [queue],
                "max_jobs": 1,
                "lease_seconds": LEASE_SECONDS,
                "wait_seconds": 0,
            }
            while True:
                answer = await http.post("/v1/claim", json=claim)
                if answer.status_code != 200:
                    errors.add(f"claim: HTTP {answer.status_code}: {answer.text[:300]}")
                    return
                jobs = answer.json()["jobs"]
                if not jobs:
                    return
                [job] = jobs
                await body_of()
                done.append(job["id"])
                lease = {"job_id": job["id"], "lease_id": job["lease_id"]}
                answer = await http.post(
                    "/v1/complete", json={"worker_id": worker_id, "leases": [lease]}
                )
                if answer.status_code != 200 or not answer.json()["results"][0]["ok"]:
                    errors.add(f"complete: HTTP {answer.status_code}: {answer.text[:300]}")

        meter.start()
        await asyncio.gather(*(loop(i) for i in range(n)))
        meter.stop()
    return done


async def lean(args: dict[str, Any], meter: Meter, errors: Errors) -> list[int]:
    """``concurrency`` tasks of claim one, run, complete, each on a lean connection of its own."""
    base, queue, n = args["base"], args["queue"], int(args["concurrency"])
    body_of = work(args["handler"])
    done: list[int] = []
    connections = [Connection(base, timeout=30.0) for _ in range(n)]
    try:
        await asyncio.gather(*(conn.get("/healthz") for conn in connections))

        async def loop(index: int, conn: Connection) -> None:
            worker_id = f"bench-lean-{index}"
            claim = {
                "worker_id": worker_id,
                "queues": [queue],
                "max_jobs": 1,
                "lease_seconds": LEASE_SECONDS,
                "wait_seconds": 0,
            }
            while True:
                try:
                    answer = await conn.post("/v1/claim", claim)
                    if answer.status != 200:
                        errors.add(f"claim: HTTP {answer.status}: {answer.body[:300]!r}")
                        return
                    jobs = answer.json()["jobs"]
                    if not jobs:
                        return
                    [job] = jobs
                    await body_of()
                    done.append(job["id"])
                    lease = {"job_id": job["id"], "lease_id": job["lease_id"]}
                    answer = await conn.post(
                        "/v1/complete", {"worker_id": worker_id, "leases": [lease]}
                    )
                except HttpError as exc:
                    errors.add(f"lean loop: {exc}")
                    return
                if answer.status != 200 or not answer.json()["results"][0]["ok"]:
                    errors.add(f"complete: HTTP {answer.status}: {answer.body[:300]!r}")

        meter.start()
        await asyncio.gather(*(loop(i, conn) for i, conn in enumerate(connections)))
        meter.stop()
    finally:
        await asyncio.gather(*(conn.close() for conn in connections))
    return done


async def worker(args: dict[str, Any], meter: Meter, errors: Errors) -> list[int]:
    """``jobq_client.Worker(concurrency=N)`` until every pre-loaded job ran, then its stop."""
    if args.get("client"):
        # Another checkout's jobq_client (an earlier commit's, say), ahead of this one's.
        sys.path.insert(0, args["client"])
    from jobq_client import JobContext, Worker

    expected = int(args["jobs"])
    body_of = work(args["handler"])
    done: list[int] = []
    options: dict[str, Any] = {}
    if args.get("claim_ahead"):
        options["claim_ahead"] = int(args["claim_ahead"])
    runner = Worker(
        args["base"],
        queues=[args["queue"]],
        concurrency=int(args["concurrency"]),
        grace_seconds=30,
        **options,
    )

    @runner.handler(args["handler"])
    async def handle(ctx: JobContext) -> None:
        await body_of()
        done.append(ctx.job_id)
        if len(done) == expected:
            runner.stop()

    meter.start()
    await runner.run(install_signal_handlers=False)
    meter.stop()
    return done


class DriverEnded(Exception):
    """The driver's output ended before it said it was ready."""


async def driven(args: dict[str, Any], meter: Meter, errors: Errors) -> list[int]:
    """Another client's ``Worker`` through its contract driver, until every job succeeded."""
    expected, queue = int(args["jobs"]), args["queue"]
    env = {key: value for key, value in os.environ.items() if not key.startswith("JOBQ_")}
    env.update(
        JOBQ_URL=args["base"],
        JOBQ_QUEUE=queue,
        JOBQ_WORKER_ID=f"bench-{args['mode']}",
        JOBQ_CONCURRENCY=str(args["concurrency"]),
        JOBQ_LEASE_SECONDS=str(LEASE_SECONDS),
        JOBQ_WAIT_SECONDS="1",
        JOBQ_GRACE_SECONDS="10",
    )
    started: list[int] = []
    ready = asyncio.Event()
    admin = await asyncpg.connect(args["dsn"])
    process = await asyncio.create_subprocess_exec(
        *args["driver"],
        "worker",
        env=env,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        limit=1 << 20,
    )
    meter.client_pid = process.pid

    async def read_events() -> None:
        assert process.stdout is not None
        async for line in process.stdout:
            event = json.loads(line)
            if event.get("event") == "ready":
                ready.set()
            elif event.get("event") == "started":
                started.append(int(event["job_id"]))
        ready.set()  # the driver ended: nothing more will come; the exit code tells why

    tail = bytearray()

    async def read_log() -> None:
        # Read as it comes, so a chatty driver never blocks on a full pipe; the end is kept.
        assert process.stderr is not None
        while chunk := await process.stderr.read(65536):
            tail.extend(chunk)
            del tail[:-2000]

    reader = asyncio.gather(read_events(), read_log())
    try:
        async with asyncio.timeout(DRIVEN_LIMIT_SECONDS):
            await ready.wait()
            if process.stdout is not None and process.stdout.at_eof():
                raise DriverEnded
            meter.start()
            while await admin.fetchval(SETTLED, queue) < expected:
                if process.returncode is not None:
                    errors.add(f"{args['mode']} driver exited {process.returncode} mid-run")
                    break
                await asyncio.sleep(SETTLED_POLL_SECONDS)
            meter.stop()
            process.send_signal(signal.SIGTERM)
            code = await process.wait()
            await reader
    except TimeoutError:
        errors.add(f"{args['mode']} driver: not done after {DRIVEN_LIMIT_SECONDS:g} s")
        code = None
    except DriverEnded:
        code = await process.wait()
        await reader
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
        reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reader
        await admin.close()
    if code != 0:
        errors.add(f"{args['mode']} driver exited {code}: {tail.decode(errors='replace')}")
    return started


async def run(args: dict[str, Any]) -> dict[str, Any]:
    """One drain; answers its figures."""
    meter, errors = Meter(args.get("server_pids", [])), Errors()
    mode: Callable[[dict[str, Any], Meter, Errors], Awaitable[list[int]]] = {
        "bare": bare,
        "lean": lean,
        "worker": worker,
        "before": worker,
        **dict.fromkeys(DRIVEN_MODES, driven),
    }[args["mode"]]
    profile = args.get("profile")
    profiler = cProfile.Profile() if profile else None
    if profiler is not None:
        profiler.enable()
    try:
        done = await mode(args, meter, errors)
    finally:
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(profile)
    return {"handled_ids": done, **meter.figures(), **errors.figures()}


def main(argv: list[str]) -> int:
    """Command line: ``'<json args>'``; prints one JSON object."""
    if len(argv) != 1:
        print("usage: python -m bench.workers_load '<json args>'")
        return 2
    result = asyncio.run(run(json.loads(argv[0])))
    sys.stdout.write(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
