"""Composed work over HTTP (issue 21): chains of workflow steps and batches that fan in to a callback.

Both workloads keep ``in_flight`` units going at once: each producer sends a unit, waits until
its last job was completed, and sends the next, until ``units`` were sent. ``workers`` workers
long-poll ``POST /v1/claim`` (``max_jobs``, ``wait_seconds``) and complete what they get in one
``POST /v1/complete`` per claim. A unit's latency runs from just before its create request was
written to just after the response of the complete that finished its last job came back, both
read in this process (timed from outside the service). The timed section ends when the last
unit ended; the workers are then stopped (nothing is left to claim).

- :func:`chain`: ``POST /v1/workflows`` with steps ``a -> b -> c``; each step's handler checks
  that its claim carries its parent's result (``parents.jobs[0].result``) and completes with a
  result of its own;
- :func:`fanin`: ``POST /v1/jobs/batch`` with ``fan`` jobs and a callback (``when:
  all_succeeded``); the callback's claim must say ``total == succeeded == fan``.

``bench/composed_raw.py`` runs the same shapes on raw SQL, with the application doing the
chaining and the fan-in counting itself.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from bench.common import LEASE_SECONDS, Counter, Errors, Flows, Meter
from bench.http import Connection
from bench.workloads import close_all, connections, open_all, post, refused

CHAIN_STEPS = ("a", "b", "c")
STEP_TYPE = "bench-step"
PART_TYPE = "bench-part"
CALLBACK_TYPE = "bench-callback"
# A unit not ended this long after it was sent counts as an error (the run goes on).
UNIT_TIMEOUT_SECONDS = 60.0

# Given a claimed job: the key of the unit it ends (None when it ends none), and its result.
Settle = Callable[[dict[str, Any], Errors], tuple[Any, Any]]


def step_result(workflow: int, step: str) -> dict[str, Any]:
    """What step ``step`` of workflow ``workflow`` completes with (its child checks it)."""
    return {"workflow": workflow, "step": step}


def chain_body(queue: str, n: int) -> dict[str, Any]:
    """``POST /v1/workflows`` of chain number ``n``: steps a -> b -> c on ``queue``."""
    steps = []
    for i, name in enumerate(CHAIN_STEPS):
        step: dict[str, Any] = {"name": name, "type": STEP_TYPE, "queue": queue}
        if i == 0:
            step["payload"] = {"n": n}
        else:
            step["after"] = [CHAIN_STEPS[i - 1]]
        steps.append(step)
    return {"name": f"bench-chain-{n}", "steps": steps}


def settle_step(job: dict[str, Any], errors: Errors) -> tuple[Any, Any]:
    """Checks a step got its parent's result; ends the workflow at its last step."""
    workflow, step = job.get("workflow_id"), job.get("workflow_step")
    if not isinstance(workflow, int) or step not in CHAIN_STEPS:
        errors.add(f"job {job['id']} is no chain step: {workflow!r} / {step!r}")
        return None, None
    index = CHAIN_STEPS.index(step)
    if index > 0:
        parents = job.get("parents") or {}
        results = [p.get("result") for p in parents.get("jobs", [])]
        expected = step_result(workflow, CHAIN_STEPS[index - 1])
        if results != [expected]:
            errors.add(f"step {step} of workflow {workflow} got parents' results {results!r}")
    ends = workflow if index == len(CHAIN_STEPS) - 1 else None
    return ends, step_result(workflow, step)


def fanin_body(queue: str, n: int, fan: int) -> dict[str, Any]:
    """``POST /v1/jobs/batch`` of batch number ``n``: ``fan`` jobs and a callback for them."""
    return {
        "jobs": [
            {"queue": queue, "type": PART_TYPE, "payload": {"batch": n, "i": i}} for i in range(fan)
        ],
        "callback": {
            "queue": queue,
            "type": CALLBACK_TYPE,
            "payload": {"batch": n},
            "when": "all_succeeded",
        },
    }


def settle_part(fan: int) -> Settle:
    """Parts end nothing; a callback checks its parents' counts and ends its batch."""

    def settle(job: dict[str, Any], errors: Errors) -> tuple[Any, Any]:
        if job["type"] != CALLBACK_TYPE:
            return None, None
        parents = job.get("parents") or {}
        counts = (parents.get("total"), parents.get("succeeded"), parents.get("failed_ids"))
        if counts != (fan, fan, []):
            errors.add(f"callback {job['id']} got total, succeeded, failed_ids {counts!r}")
        return job["id"], None

    return settle


async def run_units(
    args: dict[str, Any],
    meter: Meter,
    errors: Errors,
    *,
    send: Callable[[Connection, int], Awaitable[Any]],
    settle: Settle,
) -> dict[str, Any]:
    """Keeps ``in_flight`` units going (``send`` answers a unit's key, None on failure) while
    ``workers`` claim and complete; answers the latencies and what was completed."""
    queue, units = args["queue"], int(args["units"])
    max_jobs, wait_seconds = int(args["max_jobs"]), float(args.get("wait_seconds", 5))
    numbers = Counter(units)
    flows = Flows()
    producers = connections(args, int(args["in_flight"]))
    workers = connections(args, int(args["workers"]))
    latencies: list[float] = []
    completed: list[int] = []
    ended: list[Any] = []
    requests = 0

    async def producer(conn: Connection) -> None:
        nonlocal requests
        while chunk := numbers.take(1):
            sent = time.perf_counter()
            key = await send(conn, chunk[0])
            requests += 1
            if key is None:
                continue
            try:
                at = await flows.ended(key, UNIT_TIMEOUT_SECONDS)
            except TimeoutError:
                errors.add(f"unit {key} not ended {UNIT_TIMEOUT_SECONDS:g} s after it was sent")
                continue
            latencies.append((at - sent) * 1000)

    async def worker(index: int, conn: Connection) -> None:
        nonlocal requests
        worker_id = f"bench-composed-{index}"
        claim = {
            "worker_id": worker_id,
            "queues": [queue],
            "max_jobs": max_jobs,
            "lease_seconds": LEASE_SECONDS,
            "wait_seconds": wait_seconds,
        }
        while True:
            response = await post(conn, "/v1/claim", claim, errors, time_limit=wait_seconds + 30)
            requests += 1
            if response is None or response.status != 200:
                if response is not None:
                    errors.add(refused("claim", response))
                await asyncio.sleep(0.1)
                continue
            jobs = response.json()["jobs"]
            if not jobs:
                continue
            leases, ends = [], []
            for job in jobs:
                key, result = settle(job, errors)
                lease = {"job_id": job["id"], "lease_id": job["lease_id"]}
                if result is not None:
                    lease["result"] = result
                leases.append(lease)
                if key is not None:
                    ends.append(key)
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
            for key in ends:
                if not flows.end(key):
                    errors.add(f"unit {key} ended twice")
                ended.append(key)

    await open_all([*producers, *workers])
    meter.start()
    tasks = [asyncio.create_task(worker(i, conn)) for i, conn in enumerate(workers)]
    await asyncio.gather(*(producer(conn) for conn in producers))
    meter.stop()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await close_all([*producers, *workers])
    return {
        "units": numbers.next,
        "jobs": len(completed),
        "requests": requests,
        "latencies_ms": latencies,
        "completed_ids": completed,
        "ended": ended,
    }


async def chain(args: dict[str, Any], meter: Meter, errors: Errors) -> dict[str, Any]:
    """``units`` workflows a -> b -> c, ``in_flight`` at a time, run by ``workers`` workers."""
    queue = args["queue"]

    async def send(conn: Connection, n: int) -> Any:
        response = await post(conn, "/v1/workflows", chain_body(queue, n), errors)
        if response is None or response.status != 201:
            if response is not None:
                errors.add(refused("workflow", response))
            return None
        return response.json()["id"]

    return await run_units(args, meter, errors, send=send, settle=settle_step)


async def fanin(args: dict[str, Any], meter: Meter, errors: Errors) -> dict[str, Any]:
    """``units`` batches of ``fan`` jobs with a callback each, ``in_flight`` at a time."""
    queue, fan = args["queue"], int(args["fan"])

    async def send(conn: Connection, n: int) -> Any:
        response = await post(conn, "/v1/jobs/batch", fanin_body(queue, n, fan), errors)
        if response is None or response.status != 201:
            if response is not None:
                errors.add(refused("batch with a callback", response))
            return None
        return response.json()["callback"]["id"]

    return await run_units(args, meter, errors, send=send, settle=settle_part(fan))
