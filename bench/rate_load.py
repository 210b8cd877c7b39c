"""The fixed-rate load process: ``python -m bench.rate_load <system> '<json args>'``.

``python -m bench.rate`` starts one of these per run, so the load runs neither in the
orchestrator nor in a server. It offers ``rate`` jobs/s for ``seconds`` to one system
(``bench/rate_targets.py``: jobq, lean or pgqueuer) with ``workers`` workers running, then waits
until every job it enqueued is done: as long as jobs keep getting done (none for
:data:`STALL_SECONDS` ends it), at most ``drain_timeout_seconds``.

The schedule is open loop: job ``n`` is due at ``t0 + n / rate``, fixed in advance. At each due
time the job is sent on a free producer client (a keep-alive HTTP connection or an asyncpg
connection); the pool opens more clients as sends overlap, up to the target's
``producers_max``, so a slow answer delays no later send and a slow system accumulates a
backlog rather than slowing the producer. Only when every client is busy does a send wait: its
lag (send time less due time) is recorded, and a producer that falls behind is reported.

It prints two JSON lines on stdout: ``{"event": "started"}`` just before ``t0`` (the
orchestrator samples queue depth from then on), then the figures: per job, pickup latency from
the send to the start of work, the same from the due time, the send lag; counts; the ids
enqueued and completed; completions inside the schedule's window; this process's CPU and the
servers' (``server_pids``) over the run; and the errors.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import math
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import asyncpg

from bench.common import Errors, Meter
from bench.http import HttpError
from bench.rate_lean import LeanTarget
from bench.rate_targets import JobqTarget, PgqueuerTarget, Recorder, Target

SYSTEMS = ("jobq", "lean", "pgqueuer")
PRODUCERS_START = 4  # producer clients opened before the schedule starts
LEAD_SECONDS = 0.05  # from the "started" line to the first due time
STALL_SECONDS = 30.0  # a drain with nothing done for this long has stopped
LATE_MS = 10.0  # a send this late is late; a producer whose p99 lag is over it is behind
OPEN_ERRORS = (OSError, HttpError, asyncpg.PostgresError)


class Pool:
    """Producer clients, one send at a time each: grows to ``limit``, then sends queue for one."""

    def __init__(self, opener: Callable[..., Awaitable[Any]], limit: int) -> None:
        self.opener = opener
        self.limit = limit
        self.clients: list[Any] = []
        self.idle: list[Any] = []  # last in, first out: the warmest client goes next
        self.waiters: collections.deque[asyncio.Future[Any]] = collections.deque()
        self.opening = 0
        self.open_failures: list[str] = []

    async def warm(self, n: int) -> None:
        """Opens ``n`` clients before the schedule (failing here fails the run)."""
        opened = await asyncio.gather(*(self.opener(patient=True) for _ in range(n)))
        self.clients.extend(opened)
        self.idle.extend(opened)

    async def acquire(self) -> Any:
        """A free client: an idle one, a new one while under the limit, else the next released."""
        if self.idle:
            return self.idle.pop()
        if len(self.clients) + self.opening < self.limit:
            self.opening += 1
            try:
                client = await self.opener()
            except OPEN_ERRORS as exc:
                # Keep sending on the clients there are; the figures say how many opened.
                self.limit = len(self.clients) + self.opening - 1
                self.open_failures.append(f"{type(exc).__name__}: {exc}"[:300])
            else:
                self.clients.append(client)
                return client
            finally:
                self.opening -= 1
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.waiters.append(future)
        return await future

    def release(self, client: Any) -> None:
        """Hands ``client`` to the longest-waiting send, or back to the idle ones."""
        while self.waiters:
            future = self.waiters.popleft()
            if not future.done():
                future.set_result(client)
                return
        self.idle.append(client)

    async def close(self, closer: Callable[[Any], Awaitable[None]]) -> None:
        """Closes every client."""
        await asyncio.gather(*(closer(client) for client in self.clients))


async def produce(target: Target, pool: Pool, recorder: Recorder, rate: float, t0: float) -> None:
    """Sends job ``n`` at ``t0 + n / rate`` for every scheduled job, never waiting for an answer."""

    async def send(n: int) -> None:
        client = await pool.acquire()
        try:
            recorder.sent[n] = time.perf_counter()
            job_id = await target.enqueue(client, n)
        finally:
            pool.release(client)
        if job_id is not None:
            recorder.enqueued(job_id)

    jobs = len(recorder.scheduled)
    n = 0
    async with asyncio.TaskGroup() as group:
        while n < jobs:
            now = time.perf_counter()
            while n < jobs and (due := t0 + n / rate) <= now:
                recorder.scheduled[n] = due
                group.create_task(send(n))
                n += 1
            # Also when behind (a zero sleep): the sends and the workers get their turn.
            if n < jobs:
                await asyncio.sleep(max(0.0, t0 + n / rate - time.perf_counter()))


def target(system: str, args: dict[str, Any], errors: Errors) -> Target:
    """The target named ``system`` (jobq, lean or pgqueuer)."""
    kinds: dict[str, type[JobqTarget | LeanTarget | PgqueuerTarget]] = {
        "jobq": JobqTarget,
        "lean": LeanTarget,
        "pgqueuer": PgqueuerTarget,
    }
    return kinds[system](args, errors)


def percentile(ordered: Sequence[float], p: float) -> float:
    """The p-th percentile (0..100) of sorted values by nearest rank, as ``bench.harness``'s.

    Not imported from there: harness loads the service's migrations (SQLAlchemy, Alembic), which
    this process, started once per run, does without.
    """
    index = min(len(ordered) - 1, max(0, round(p / 100 * (len(ordered) - 1))))
    return ordered[index]


async def drain(recorder: Recorder, limit: float) -> str | None:
    """Waits until every enqueued job is done; answers why not when none got done for
    :data:`STALL_SECONDS`, or after ``limit`` seconds in all."""
    deadline = time.perf_counter() + limit
    done = -1
    while not recorder.drained.is_set():
        if len(recorder.completed_ids) == done:
            left = len(recorder.enqueued_ids) - done
            return f"{left} jobs not done, and none done in the last {STALL_SECONDS:g} s"
        if time.perf_counter() > deadline:
            left = len(recorder.enqueued_ids) - len(recorder.completed_ids)
            return f"{left} jobs not done {limit:g} s after the schedule ended"
        done = len(recorder.completed_ids)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(recorder.drained.wait(), STALL_SECONDS)
    return None


def spread(values_ms: Sequence[float]) -> dict[str, Any]:
    """p50, p95, p99, max, mean and count of samples in ms (None when there are none)."""
    if not values_ms:
        return {"n": 0, "p50": None, "p95": None, "p99": None, "max": None, "mean": None}
    ordered = sorted(values_ms)
    return {
        "n": len(ordered),
        "p50": percentile(ordered, 50),
        "p95": percentile(ordered, 95),
        "p99": percentile(ordered, 99),
        "max": ordered[-1],
        "mean": statistics.fmean(ordered),
    }


def differences_ms(later: Sequence[float], earlier: Sequence[float]) -> list[float]:
    """``later - earlier`` in ms for every job where both are known."""
    return [
        (b - a) * 1000
        for a, b in zip(earlier, later, strict=True)
        if not (math.isnan(a) or math.isnan(b))
    ]


def figures(recorder: Recorder, seconds: float) -> dict[str, Any]:
    """The run's figures from what the recorder saw."""
    sent = [t for t in recorder.sent if not math.isnan(t)]
    lag = differences_ms(recorder.sent, recorder.scheduled)
    return {
        "jobs_scheduled": len(recorder.scheduled),
        "sent": len(sent),
        "started": sum(1 for t in recorder.started if not math.isnan(t)),
        "started_twice": recorder.started_twice,
        "enqueued_ids": recorder.enqueued_ids,
        "completed_ids": recorder.completed_ids,
        "completed_in_window": recorder.completed_in_window,
        # Both in the schedule's window: what was sent, and what was done, per second.
        "offered_per_s": sum(1 for t in sent if t <= recorder.window_end) / seconds,
        "completed_per_s": recorder.completed_in_window / seconds,
        "pickup_ms": spread(differences_ms(recorder.started, recorder.sent)),
        "pickup_from_schedule_ms": spread(differences_ms(recorder.started, recorder.scheduled)),
        "send_lag_ms": spread(lag),
        "late_sends": sum(1 for value in lag if value > LATE_MS),
    }


async def run(system: str, args: dict[str, Any]) -> dict[str, Any]:
    """One fixed-rate run against ``system``; answers its figures, the meter's and the errors."""
    rate, seconds = float(args["rate"]), float(args["seconds"])
    drain_timeout = float(args["drain_timeout_seconds"])
    meter, errors = Meter(args.get("server_pids", [])), Errors()
    chosen = target(system, args, errors)
    recorder = Recorder(max(1, round(rate * seconds)), errors)
    pool = Pool(chosen.open_producer, chosen.producers_max)
    await pool.warm(min(PRODUCERS_START, chosen.producers_max))
    t0 = drained_at = math.nan
    try:
        async with chosen.workers(int(args["workers"]), recorder):
            t0 = time.perf_counter() + LEAD_SECONDS
            recorder.window_end = t0 + seconds
            sys.stdout.write(json.dumps({"event": "started"}) + "\n")
            sys.stdout.flush()
            meter.start()
            await produce(chosen, pool, recorder, rate, t0)
            recorder.production_ended()
            if stalled := await drain(recorder, drain_timeout):
                errors.add(stalled)
            drained_at = time.perf_counter()
            meter.stop()
    finally:
        await pool.close(chosen.close_producer)
    return {
        "system": system,
        **figures(recorder, seconds),
        "drain_seconds": max(0.0, drained_at - recorder.window_end),
        "producers_opened": len(pool.clients),
        "producer_open_failures": pool.open_failures[:5],
        **meter.figures(),
        **errors.figures(),
    }


def main(argv: Sequence[str]) -> int:
    """Command line: ``<system> <json args>``; prints the started line, then the figures."""
    if len(argv) != 2 or argv[0] not in SYSTEMS:
        print(f"usage: python -m bench.rate_load {{{','.join(SYSTEMS)}}} '<json args>'")
        return 2
    result = asyncio.run(run(argv[0], json.loads(argv[1])))
    sys.stdout.write(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
