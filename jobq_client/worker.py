"""``Worker``: claims jobs, runs their handlers and stops gracefully; a ``LeaseKeeper`` keeps the leases.

One worker runs up to ``concurrency`` handlers, each in its own task. Three kinds of task exist
while :meth:`Worker.run` runs, all owned and awaited by it:

- the claim loop: long-polls ``POST /v1/claim`` for as many jobs as there are free slots;
- the heartbeat loop of the run's :class:`~jobq_client.leases.LeaseKeeper`: every
  ``heartbeat_interval`` one ``POST /v1/heartbeat`` for every held lease; an item answered
  ``ok: false`` (lease lost, or the job was cancelled) cancels that handler, and the worker never
  completes, fails or releases that job afterwards;
- per job, a supervisor task that runs the handler in a task of its own and then has the lease
  keeper complete (returned), fail (raised) or release (stopped) the job. A job of a type the
  worker has no handler for is released for ``unknown_type_delay_seconds``, never failed.
  Unless stopping, that same request claims the worker's next jobs (``claim_next``, without
  waiting) for the slot it frees and any other free one, so a busy worker makes one request per
  job; the claim loop long-polls only for slots nobody is claiming for already;
- completes are shared: one request at a time carries every job whose handler returned since
  the last one went out (a task lives while there are any), and claims for all the slots they
  free, so a wide worker makes one request per batch, not per job. Fails, releases and the
  completes of traced jobs (a request carries one ``traceparent``) go one job per request.

Stopping (``stop()``, SIGTERM or SIGINT): claiming stops at once, every running ``JobContext``
says ``stopping``, and a handler's next ``save_checkpoint`` saves and then raises
:class:`StopRequested`, after which the job is released with that checkpoint so the next worker
starts at once. Handlers still running after ``grace_seconds`` are cancelled and their jobs
released keeping the last saved checkpoint. A second stop request ends the grace period early.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import contextvars
import inspect
import json
import logging
import os
import secrets
import signal
import socket
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import httpx

from jobq_client import tracing
from jobq_client.client import DEFAULT_BASE_URL, Client
from jobq_client.context import JobContext
from jobq_client.errors import JobqError
from jobq_client.leases import MAX_LEASES_PER_CALL, HeldJob, LeaseKeeper
from jobq_client.retry import Backoff, describe, is_transient

__all__ = ["Handler", "JobContext", "Worker", "default_worker_id", "worker_pool"]

logger = logging.getLogger("jobq_client.worker")

Handler = Callable[[JobContext], Awaitable[Any]]
HandlerT = TypeVar("HandlerT", bound=Handler)

MAX_CLAIM_JOBS = 100  # the service's per-claim limit
MAX_WAIT_SECONDS = 20.0  # the service's long-poll limit
IDLE_PAUSE_SECONDS = 0.5  # an empty claim answered faster than this is followed by a pause
MAX_RELEASE_DELAY_SECONDS = 30 * 24 * 3600  # the service's limit of a release's delay_seconds
# How long a job of a type this worker has no handler for goes back to the queue: long enough
# not to bounce between old workers in a rolling deploy, short enough that a new one soon runs it.
UNKNOWN_TYPE_DELAY_SECONDS = 60.0


def worker_pool(concurrency: int) -> httpx.Limits:
    """The connection pool a worker's client keeps.

    A few requests are in flight at once whatever the concurrency: the claim's long-poll, a
    heartbeat, one shared complete, and checkpoints, fails and releases of single jobs. Every
    connection stays alive: httpcore closes idle connections whenever the pool holds more than
    ``max_keepalive_connections``, so a pool allowed more connections than it keeps alive opened
    a connection for nearly every request, and it scans the whole pool for each request.
    """
    size = min(concurrency, 16) + 4
    return httpx.Limits(max_connections=size, max_keepalive_connections=size)


def default_worker_id() -> str:
    """A worker id naming this host and process, plus a random part so two workers never share one."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


class Worker:
    """Runs registered async handlers for claimed jobs, keeping their leases alive with heartbeats."""

    def __init__(
        self,
        base_url: str = DEFAULT_BASE_URL,
        *,
        queues: list[str] | None = None,
        concurrency: int = 4,
        lease_seconds: int = 30,
        worker_id: str | None = None,
        grace_seconds: float = 30.0,
        wait_seconds: float = 20.0,
        heartbeat_interval: float | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        api_key: str | None = None,
        unknown_type_delay_seconds: float = UNKNOWN_TYPE_DELAY_SECONDS,
        claim_next: bool = True,
        claim_ahead: int = 0,
    ) -> None:
        queues = ["default"] if queues is None else list(queues)
        if not queues:
            raise ValueError("queues must name at least one queue")
        if concurrency < 1:
            raise ValueError("concurrency must be >= 1")
        if not 1 <= lease_seconds <= 43200:
            raise ValueError("lease_seconds must be within 1..43200")
        if grace_seconds < 0:
            raise ValueError("grace_seconds must be >= 0")
        if not 0 <= wait_seconds <= MAX_WAIT_SECONDS:
            raise ValueError(f"wait_seconds must be within 0..{MAX_WAIT_SECONDS:g}")
        if not 0 <= unknown_type_delay_seconds <= MAX_RELEASE_DELAY_SECONDS:
            raise ValueError(
                f"unknown_type_delay_seconds must be within 0..{MAX_RELEASE_DELAY_SECONDS}"
            )
        if not 0 <= claim_ahead <= MAX_CLAIM_JOBS:
            raise ValueError(f"claim_ahead must be within 0..{MAX_CLAIM_JOBS}")
        if heartbeat_interval is None:
            heartbeat_interval = lease_seconds / 3
        if not 0 < heartbeat_interval <= lease_seconds / 3:
            raise ValueError(
                "heartbeat_interval must be > 0 and at most lease_seconds / 3, so that two "
                "heartbeats can fail before the lease expires"
            )
        self.base_url = base_url
        self.api_key = api_key  # a worker key: its leases are bound to it
        self.queues = queues
        self.concurrency = concurrency
        self.lease_seconds = lease_seconds
        self.worker_id = worker_id or default_worker_id()
        self.grace_seconds = grace_seconds
        self.wait_seconds = wait_seconds
        self.heartbeat_interval = heartbeat_interval
        self.unknown_type_delay_seconds = unknown_type_delay_seconds
        # Settling a job claims the next ones in the same request (False: the claim loop only).
        self.claim_next = claim_next
        # Jobs held beyond the running ones, each started the moment a handler returns, so no
        # slot waits for a round trip; held longer, they wait for a slot instead of another worker.
        self.claim_ahead = claim_ahead
        self.transport = transport
        # A request that takes longer than the lease is of no use to a worker.
        self.request_timeout = max(2.0, min(30.0, float(lease_seconds)))
        self._handlers: dict[str, Handler] = {}
        self._leases: LeaseKeeper | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._client: Client | None = None
        self._claimer: asyncio.Task[None] | None = None
        self._stopping: asyncio.Event | None = None
        self._grace_over: asyncio.Event | None = None
        self._slot_free: asyncio.Event | None = None
        self._stop_before_run = False
        # Slots asked for by claims in flight: the claim loop's, and those riding on settle calls.
        self._claiming = 0
        # Held jobs whose settle call claims for their slot (so counted in _claiming instead).
        self._handing_over = 0
        # Handlers that returned, waiting for the next shared complete request, and its sender.
        self._to_complete: list[tuple[HeldJob, Any, asyncio.Future[None]]] = []
        self._flusher: asyncio.Task[None] | None = None
        # Claimed ahead, held (heartbeated) and waiting for a handler slot, oldest first.
        self._ready: collections.deque[HeldJob] = collections.deque()
        self._running = 0  # handlers running: never more than concurrency

    # -- configuration ---------------------------------------------------------------------

    def handler(self, job_type: str) -> Callable[[HandlerT], HandlerT]:
        """Registers the decorated ``async def handler(ctx: JobContext)`` for jobs of ``job_type``."""

        def register(function: HandlerT) -> HandlerT:
            """Checks and records the handler; answers it unchanged."""
            if not (
                inspect.iscoroutinefunction(function)
                or inspect.iscoroutinefunction(getattr(function, "__call__", None))  # noqa: B004
            ):
                raise TypeError(f"the handler for {job_type!r} must be an async function")
            if job_type in self._handlers:
                raise ValueError(f"a handler for {job_type!r} is registered already")
            self._handlers[job_type] = function
            return function

        return register

    @property
    def job_types(self) -> list[str]:
        """The job types this worker has handlers for."""
        return sorted(self._handlers)

    @property
    def running_job_ids(self) -> list[int]:
        """Ids of the jobs this worker holds now."""
        return [held.ref["job_id"] for held in self._held_jobs()]

    def _held_jobs(self) -> list[HeldJob]:
        return self._leases.jobs() if self._leases is not None else []

    # -- running ---------------------------------------------------------------------------

    async def run(self, install_signal_handlers: bool = True) -> None:
        """Claims and runs jobs until :meth:`stop`, SIGTERM or SIGINT, then stops gracefully.

        Signal handlers are installed only when ``install_signal_handlers`` is true and this
        runs on the main thread's event loop; they are removed again before returning.
        Transient HTTP errors are logged and retried; an error answer to the claim that will not
        go away by retrying (a 4xx: an invalid queue name, say) stops the worker and is raised.
        """
        if self._loop is not None:
            raise RuntimeError("this worker is running already")
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._stopping = asyncio.Event()
        self._grace_over = asyncio.Event()
        self._slot_free = asyncio.Event()
        self._claiming = self._handing_over = 0
        self._to_complete = []
        self._ready.clear()
        self._running = 0
        signals = self._install_signal_handlers(loop) if install_signal_handlers else []
        client = Client(
            self.base_url,
            timeout=self.request_timeout,
            transport=self.transport,
            api_key=self.api_key,
            limits=worker_pool(self.concurrency),
        )
        self._client = client
        self._leases = LeaseKeeper(
            client,
            worker_id=self.worker_id,
            lease_seconds=self.lease_seconds,
            heartbeat_interval=self.heartbeat_interval,
        )
        logger.info(
            "worker %s: queues %s, concurrency %d, lease %d s, handlers %s",
            self.worker_id,
            ",".join(self.queues),
            self.concurrency,
            self.lease_seconds,
            ",".join(self.job_types) or "-",
        )
        try:
            async with client:
                await self._run_loops()
        finally:
            for sig in signals:
                loop.remove_signal_handler(sig)
            self._loop = None
            self._client = None
            self._leases = None
            self._claimer = None
            self._stop_before_run = False
            logger.info("worker %s stopped", self.worker_id)

    async def _run_loops(self) -> None:
        assert self._stopping is not None and self._leases is not None
        claimer = asyncio.create_task(self._claim_loop(), name="jobq-claim")
        self._claimer = claimer
        heartbeats = asyncio.create_task(self._leases.run_heartbeats(), name="jobq-heartbeat")
        stop_wait = asyncio.create_task(self._stopping.wait(), name="jobq-stop-wait")
        if self._stop_before_run:
            self._begin_stop()
        try:
            try:
                await asyncio.wait([claimer, stop_wait], return_when=asyncio.FIRST_COMPLETED)
                self._begin_stop()
                await self._drain(self.grace_seconds)
            except asyncio.CancelledError:
                # run() itself was cancelled: no grace, but still hand every job back.
                self._begin_stop()
                await self._drain(0)
                raise
        finally:
            loops = (claimer, heartbeats, stop_wait)
            for task in loops:
                task.cancel()
            await asyncio.gather(*loops, return_exceptions=True)
        if not claimer.cancelled() and (error := claimer.exception()) is not None:
            raise error

    def stop(self) -> None:
        """Begins a graceful stop, as SIGTERM does; a second call ends the grace period early.

        Safe to call from another thread, and before :meth:`run` (which then returns at once).
        """
        loop = self._loop
        if loop is None:
            self._stop_before_run = True
            return
        try:
            current: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            current = None
        if current is loop:
            self._request_stop()
        else:
            loop.call_soon_threadsafe(self._request_stop)

    def _request_stop(self) -> None:
        if self._stopping is None:
            return
        if self._stopping.is_set():
            assert self._grace_over is not None
            if not self._grace_over.is_set():
                logger.warning(
                    "worker %s: second stop request, ending the grace period", self.worker_id
                )
                self._grace_over.set()
            return
        logger.info(
            "worker %s: stopping (holding %d jobs, grace %g s)",
            self.worker_id,
            len(self._held_jobs()),
            self.grace_seconds,
        )
        self._begin_stop()

    def _begin_stop(self) -> None:
        """Stops claiming now (the in-flight long-poll is cancelled) and tells every handler."""
        assert self._stopping is not None
        self._stopping.set()
        if self._claimer is not None:
            self._claimer.cancel()
        for held in self._held_jobs():
            held.ctx.mark_stopping()

    def _install_signal_handlers(self, loop: asyncio.AbstractEventLoop) -> list[signal.Signals]:
        if threading.current_thread() is not threading.main_thread():
            return []
        installed: list[signal.Signals] = []
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                loop.add_signal_handler(sig, self._request_stop)
            except (NotImplementedError, RuntimeError, ValueError):  # not supported here
                continue
            installed.append(sig)
        return installed

    async def _drain(self, grace: float) -> None:
        """Waits up to ``grace`` seconds for running jobs, then cancels the rest and awaits them."""
        assert self._loop is not None and self._grace_over is not None
        deadline = self._loop.time() + grace
        await self._hand_back_ready()
        while self._held_jobs() and not self._grace_over.is_set():
            remaining = deadline - self._loop.time()
            if remaining <= 0:
                break
            tasks: set[asyncio.Future[Any]] = {
                held.task for held in self._held_jobs() if held.task is not None
            }
            grace_over = asyncio.ensure_future(self._grace_over.wait())
            try:
                await asyncio.wait(
                    tasks | {grace_over}, timeout=remaining, return_when=asyncio.FIRST_COMPLETED
                )
            finally:
                grace_over.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await grace_over
        await self._hand_back_ready()
        left = self._held_jobs()
        if left:
            logger.warning(
                "worker %s: cancelling %d handlers still running after the grace period",
                self.worker_id,
                len(left),
            )
        for held in left:
            if held.handler_task is not None:
                held.handler_task.cancel()
        supervisors = [held.task for held in self._held_jobs() if held.task is not None]
        if supervisors:
            await asyncio.wait(supervisors)

    async def _hand_back_ready(self) -> None:
        """Releases the jobs claimed ahead that no handler started (stopping: none will)."""
        assert self._leases is not None and self._client is not None
        waiting, leases = list(self._ready), self._leases
        self._ready.clear()
        held = [h for h in waiting if not h.lost]
        try:
            if held:
                await self._client.release(self.worker_id, [h.ref for h in held])
        except (JobqError, httpx.TransportError) as exc:
            logger.warning(
                "worker %s: handing back %d jobs claimed ahead failed (%s); "
                "they return when their leases expire",
                self.worker_id,
                len(held),
                describe(exc),
            )
        finally:
            for h in waiting:
                leases.drop(h)

    # -- claiming --------------------------------------------------------------------------

    def _free(self) -> int:
        """Slots (running and claimed ahead) neither taken by a held job nor asked for by a claim
        in flight."""
        assert self._leases is not None
        taken = len(self._leases) - self._handing_over
        return self.concurrency + self.claim_ahead - taken - self._claiming

    async def _claim_loop(self) -> None:
        assert self._client is not None and self._slot_free is not None and self._loop is not None
        assert self._leases is not None
        backoff = Backoff()
        while True:
            free = self._free()
            if free <= 0:
                self._slot_free.clear()
                await self._slot_free.wait()
                continue
            started = self._loop.time()
            try:
                jobs = await self._claim(min(free, MAX_CLAIM_JOBS))
            except Exception as exc:
                if not is_transient(exc):
                    logger.error("worker %s: claim refused: %s", self.worker_id, exc)
                    raise
                delay = backoff.next()
                logger.warning(
                    "worker %s: claim failed (%s); retrying in %.1f s",
                    self.worker_id,
                    describe(exc),
                    delay,
                )
                await asyncio.sleep(delay)
                continue
            backoff.reset()
            for job in jobs:
                self._start(job)
            elapsed = self._loop.time() - started
            if not jobs and elapsed < IDLE_PAUSE_SECONDS:
                # Answered empty at once (no wait asked, or the service is shutting down).
                await asyncio.sleep(IDLE_PAUSE_SECONDS - elapsed)

    async def _claim(self, max_jobs: int) -> list[dict[str, Any]]:
        """One long-polling claim, its slots reserved while it runs."""
        assert self._client is not None
        self._claiming += max_jobs
        try:
            return await self._client.claim(
                self.worker_id,
                self.queues,
                max_jobs=max_jobs,
                lease_seconds=self.lease_seconds,
                wait_seconds=self.wait_seconds,
            )
        finally:
            self._claiming -= max_jobs

    def _claim_next(self) -> dict[str, Any] | None:
        """The claim a settle call makes for the slot it frees and any other free one, reserved
        until it is answered; ``None`` while stopping (or when the service refuses them)."""
        stopping, leases = self._stopping, self._leases
        if not self.claim_next or stopping is None or stopping.is_set() or leases is None:
            return None
        if leases.claim_next_refused:
            return None
        free = min(self._free() + 1, MAX_CLAIM_JOBS)  # + 1: the settling job's own slot
        if free <= 0:
            return None
        self._claiming += free
        self._handing_over += 1
        return {"queues": self.queues, "max_jobs": free, "lease_seconds": self.lease_seconds}

    async def _take(self, jobs: list[dict[str, Any]]) -> None:
        """Runs the jobs a settle call claimed; once stopping, hands them straight back."""
        if not jobs:
            return
        assert self._stopping is not None and self._client is not None
        if not self._stopping.is_set():
            for job in jobs:
                self._start(job)
            return
        leases = [{"job_id": job["id"], "lease_id": job["lease_id"]} for job in jobs]
        try:
            await self._client.release(self.worker_id, leases)
        except (JobqError, httpx.TransportError) as exc:
            logger.warning(
                "worker %s: handing back %d jobs claimed as it stopped failed (%s); "
                "they return when their leases expire",
                self.worker_id,
                len(jobs),
                describe(exc),
            )

    def _start(self, job: dict[str, Any]) -> None:
        """Holds a claimed job and runs it now, or once a handler slot frees (claimed ahead)."""
        assert self._leases is not None
        held = self._leases.hold(job)
        if self._stopping is not None and self._stopping.is_set():
            held.ctx.mark_stopping()
        if self._running < self.concurrency:
            self._launch(held)
        else:
            self._ready.append(held)
        logger.debug(
            "worker %s: claimed job %s (%s, attempt %s)",
            self.worker_id,
            job["id"],
            job.get("type"),
            job.get("attempt"),
        )

    def _launch(self, held: HeldJob) -> None:
        self._running += 1
        held.task = asyncio.create_task(
            self._supervise(held), name=f"jobq-job-{held.ref['job_id']}"
        )

    def _handler_ended(self) -> None:
        """A handler slot is free: the oldest job claimed ahead takes it (none once stopping)."""
        self._running -= 1
        if self._leases is None or self._slot_free is None:
            return  # the run is over
        while self._ready and self._running < self.concurrency:
            if self._stopping is not None and self._stopping.is_set():
                return  # the drain hands them back
            held = self._ready.popleft()
            if held.lost:  # its lease went while it waited: never run, never settled
                self._leases.drop(held)
                self._slot_free.set()
                continue
            self._launch(held)

    # -- one job ---------------------------------------------------------------------------

    async def _supervise(self, held: HeldJob) -> None:
        """Runs the job's handler in its own task, then has the job settled by what became of it."""
        assert self._slot_free is not None and self._leases is not None
        # The run's keeper, even should run() end (and drop it) before this job does.
        leases = self._leases
        job_id = held.ref["job_id"]
        ask: dict[str, Any] | None = None
        running = True  # holds a handler slot
        try:
            handler = self._handlers.get(held.ctx.type)
            if handler is None:
                running = False
                self._handler_ended()
                # In a rolling deploy new types reach old workers first: hand the job back for a
                # worker that knows it instead of failing work nobody here could do.
                logger.warning(
                    "worker %s: no handler for job %s of type %r (this worker handles: %s); "
                    "releasing it for %g s for a worker that has one",
                    self.worker_id,
                    job_id,
                    held.ctx.type,
                    ", ".join(self.job_types) or "nothing",
                    self.unknown_type_delay_seconds,
                )
                ask = self._claim_next()
                claimed = await self._settled(
                    ask,
                    leases.release(
                        held, delay_seconds=self.unknown_type_delay_seconds, claim_next=ask
                    ),
                )
                await self._take(claimed)
                return
            # The handler's task starts inside the span, so its own spans are children of it,
            # and the settling call carries it to the service.
            with tracing.process_span(held.ctx.job):
                task = asyncio.create_task(_call(handler, held.ctx), name=f"jobq-handler-{job_id}")
                held.handler_task = task
                try:
                    await asyncio.wait([task])
                except asyncio.CancelledError:
                    task.cancel()
                    raise
                # Before the settle's round trip: a job claimed ahead starts now.
                running = False
                self._handler_ended()
                # A stop or a lost lease is a BaseException: not the handler failing.
                if not task.cancelled() and isinstance(error := task.exception(), Exception):
                    tracing.record_failure(error)
                if self._batchable(held, task):
                    # Settled with whatever other jobs finished meanwhile, in one request.
                    await self._complete_batched(held, task.result())
                    return
                ask = self._claim_next()
                claimed = await self._settled(ask, leases.settle(held, task, claim_next=ask))
            await self._take(claimed)
        except Exception:
            logger.exception("worker %s: settling job %s failed", self.worker_id, job_id)
        finally:
            if running:
                self._handler_ended()
            if ask is not None:
                self._handing_over -= 1
            leases.drop(held)
            self._slot_free.set()

    def _batchable(self, held: HeldJob, task: asyncio.Task[Any]) -> bool:
        """Whether the job may be completed in a request shared with other jobs: its handler
        returned a JSON result, its lease is held, and no trace needs its own request (a
        request carries one ``traceparent``: a traced job's complete stays a child of its span)."""
        if held.lost or task.cancelled() or task.exception() is not None or tracing.active():
            return False
        try:
            json.dumps(task.result(), allow_nan=False)
        except (TypeError, ValueError):
            return False  # the lease keeper fails it, saying why
        return True

    async def _complete_batched(self, held: HeldJob, result: Any) -> None:
        """Queues the job's complete and waits until a request carried it (or gave up on it)."""
        assert self._loop is not None
        done = self._loop.create_future()
        self._to_complete.append((held, result, done))
        if self._flusher is None:
            # A context of its own: the shared requests belong to no one job's trace.
            self._flusher = asyncio.create_task(
                self._flush_completes(), name="jobq-complete", context=contextvars.Context()
            )
        await done

    async def _flush_completes(self) -> None:
        """Sends the queued completes, one request at a time, each carrying every job that
        finished while the one before was in flight; the request claims for the slots it frees
        and any other free one. One at a time: while one is out, the next batch grows, so a busy
        worker makes few requests however wide it is."""
        assert self._leases is not None
        leases = self._leases
        try:
            while self._to_complete:
                batch = self._to_complete[:MAX_LEASES_PER_CALL]
                del self._to_complete[:MAX_LEASES_PER_CALL]
                self._handing_over += len(batch)
                ask = self._claim_next_for_batch()
                try:
                    claimed = await leases.complete_many(
                        [(held, result) for held, result, _ in batch], claim_next=ask
                    )
                except Exception as exc:  # noqa: BLE001 - each supervisor logs it
                    for _, _, done in batch:
                        if not done.done():
                            done.set_exception(exc)
                    claimed = []
                except BaseException:
                    for _, _, done in batch:
                        done.cancel()
                    raise
                finally:
                    if ask is not None:
                        self._claiming -= ask["max_jobs"]
                    self._handing_over -= len(batch)
                    for held, _, _ in batch:
                        leases.drop(held)
                try:
                    # Started before the supervisors wake, so their slots are taken at once.
                    await self._take(claimed)
                finally:
                    for _, _, done in batch:
                        if not done.done():
                            done.set_result(None)
        finally:
            self._flusher = None
            if self._to_complete:  # cancelled itself: nobody is left to send these
                for _, _, done in self._to_complete:
                    done.cancel()
                self._to_complete.clear()

    def _claim_next_for_batch(self) -> dict[str, Any] | None:
        """The claim a shared complete makes for the free slots (its own jobs' among them, as they
        count in ``_handing_over``), reserved until it is answered; ``None`` while stopping."""
        stopping, leases = self._stopping, self._leases
        if not self.claim_next or stopping is None or stopping.is_set() or leases is None:
            return None
        if leases.claim_next_refused:
            return None
        free = min(self._free(), MAX_CLAIM_JOBS)
        if free <= 0:
            return None
        self._claiming += free
        return {"queues": self.queues, "max_jobs": free, "lease_seconds": self.lease_seconds}

    async def _settled(
        self, ask: dict[str, Any] | None, settling: Awaitable[list[dict[str, Any]]]
    ) -> list[dict[str, Any]]:
        """Awaits a settle call; the slots its claim reserved are free again once it answered
        (the jobs it claimed are started before anything else runs)."""
        try:
            return await settling
        finally:
            if ask is not None:
                self._claiming -= ask["max_jobs"]


async def _call(handler: Handler, ctx: JobContext) -> Any:
    return await handler(ctx)
