"""``Worker``: claims jobs, runs their handlers, heartbeats every held lease, and stops gracefully.

One worker runs up to ``concurrency`` handlers, each in its own task. Three kinds of task exist
while :meth:`Worker.run` runs, all owned and awaited by it:

- the claim loop: long-polls ``POST /v1/claim`` for as many jobs as there are free slots;
- the heartbeat loop: every ``heartbeat_interval`` one ``POST /v1/heartbeat`` for every held lease;
  an item answered ``ok: false`` (lease lost, or the job was cancelled) cancels that handler, and
  the worker never completes, fails or releases that job afterwards;
- per job, a supervisor task that runs the handler in a task of its own and then completes
  (returned), fails (raised) or releases (stopped) the job.

Stopping (``stop()``, SIGTERM or SIGINT): claiming stops at once, every running ``JobContext``
says ``stopping``, and a handler's next ``save_checkpoint`` saves and then raises
:class:`StopRequested`, after which the job is released with that checkpoint so the next worker
starts at once. Handlers still running after ``grace_seconds`` are cancelled and their jobs
released keeping the last saved checkpoint. A second stop request ends the grace period early.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import logging
import os
import secrets
import signal
import socket
import threading
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

import httpx

from jobq_client.client import DEFAULT_BASE_URL, Client
from jobq_client.errors import JobqError, LeaseLost, NonRetryableError, StopRequested

logger = logging.getLogger("jobq_client.worker")

Handler = Callable[["JobContext"], Awaitable[Any]]
CheckpointSaver = Callable[[Any, Any], Awaitable[None]]
HandlerT = TypeVar("HandlerT", bound=Handler)

MAX_CLAIM_JOBS = 100  # the service's per-claim limit
MAX_LEASES_PER_CALL = 1000  # the service's limit of lease items per call
MAX_WAIT_SECONDS = 20.0  # the service's long-poll limit
IDLE_PAUSE_SECONDS = 0.5  # an empty claim answered faster than this is followed by a pause
BACKOFF_FIRST_SECONDS = 0.2
BACKOFF_CAP_SECONDS = 5.0
SAVE_TRIES = 3  # transient failures of save_checkpoint's heartbeat before the error is raised
SETTLE_RETRY_SECONDS = 10.0  # how long complete / fail / release are retried on transient errors
ERROR_TEXT_MAX_CHARS = 65536  # the service's limit for a fail item's ``error``


def _is_transient(exc: BaseException) -> bool:
    """Whether a failed call is worth repeating: no connection, a timeout, a 5xx / 429, bad JSON."""
    if isinstance(exc, JobqError):
        return exc.transient
    return isinstance(exc, httpx.TransportError | json.JSONDecodeError)


class _Backoff:
    """Exponential pauses between retries of a failing call, reset on success."""

    def __init__(self) -> None:
        self._next = BACKOFF_FIRST_SECONDS

    def next(self) -> float:
        """The pause before the next try; each is twice the last, up to the cap."""
        delay = self._next
        self._next = min(self._next * 2, BACKOFF_CAP_SECONDS)
        return delay

    def reset(self) -> None:
        """Starts over from the shortest pause."""
        self._next = BACKOFF_FIRST_SECONDS


class JobContext:
    """What a handler receives: the claimed job, its last checkpoint and the worker's signals.

    ``cancelled`` turns true when the service says the job was cancelled under this lease;
    ``stopping`` turns true when the worker begins a graceful stop. Outside a worker (in a
    handler's own unit tests, say) a context can be built from a job dict alone; its
    ``save_checkpoint`` then only records the state.
    """

    def __init__(
        self, job: Mapping[str, Any], *, checkpoint_saver: CheckpointSaver | None = None
    ) -> None:
        self.job: dict[str, Any] = dict(job)
        self.checkpoint: Any = self.job.get("checkpoint")
        self.progress: Any = self.job.get("progress")
        self._saver = checkpoint_saver
        self._cancelled = False
        self._stopping = False

    @property
    def job_id(self) -> int:
        """The job's id (stable across attempts: use it to make side effects idempotent)."""
        job_id: int = self.job["id"]
        return job_id

    @property
    def type(self) -> str:
        """The job's type, which chose the handler."""
        job_type: str = self.job["type"]
        return job_type

    @property
    def attempt(self) -> int:
        """This try's number, 1 on the first (a release does not use one up)."""
        attempt: int = self.job.get("attempt", self.job.get("attempts", 1))
        return attempt

    @property
    def payload(self) -> Any:
        """The job's payload, as enqueued."""
        return self.job.get("payload")

    @property
    def lease_id(self) -> str | None:
        """The lease this worker holds the job under."""
        lease_id: str | None = self.job.get("lease_id")
        return lease_id

    @property
    def cancelled(self) -> bool:
        """Whether the job was cancelled while this handler ran (its task is cancelled too)."""
        return self._cancelled

    @property
    def stopping(self) -> bool:
        """Whether the worker is shutting down: save a checkpoint and the job is handed back."""
        return self._stopping

    async def save_checkpoint(self, state: Any, progress: Any = None) -> None:
        """Saves ``state`` (any JSON) as the job's checkpoint now, with the lease's ownership check.

        The next attempt of the job (after a crash, a release or a lease expiry) receives it as
        ``ctx.checkpoint``. Raises :class:`LeaseLost` when the lease is no longer held, and
        :class:`StopRequested` after saving when the worker is stopping.
        """
        if self._saver is None:
            self.checkpoint = state
            if progress is not None:
                self.progress = progress
            return
        await self._saver(state, progress)


class _Held:
    """One job this worker holds: its lease, context, tasks and what became of it."""

    __slots__ = ("ctx", "handler_task", "job", "lost", "ref", "release_checkpoint", "task")

    def __init__(self, job: dict[str, Any]) -> None:
        self.job = job
        self.ref: dict[str, Any] = {"job_id": job["id"], "lease_id": job["lease_id"]}
        self.ctx: JobContext = JobContext(job)
        self.task: asyncio.Task[None] | None = None
        self.handler_task: asyncio.Task[Any] | None = None
        self.lost = False
        self.release_checkpoint = False

    @property
    def key(self) -> tuple[int, str]:
        """The job and lease ids: a job claimed again after a loss is a different lease."""
        return (self.ref["job_id"], self.ref["lease_id"])


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
        if heartbeat_interval is None:
            heartbeat_interval = lease_seconds / 3
        if not 0 < heartbeat_interval <= lease_seconds / 3:
            raise ValueError(
                "heartbeat_interval must be > 0 and at most lease_seconds / 3, so that two "
                "heartbeats can fail before the lease expires"
            )
        self.base_url = base_url
        self.queues = queues
        self.concurrency = concurrency
        self.lease_seconds = lease_seconds
        self.worker_id = worker_id or default_worker_id()
        self.grace_seconds = grace_seconds
        self.wait_seconds = wait_seconds
        self.heartbeat_interval = heartbeat_interval
        self.transport = transport
        # A request that takes longer than the lease is of no use to a worker.
        self.request_timeout = max(2.0, min(30.0, float(lease_seconds)))
        self._handlers: dict[str, Handler] = {}
        self._held: dict[tuple[int, str], _Held] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._client: Client | None = None
        self._claimer: asyncio.Task[None] | None = None
        self._stopping: asyncio.Event | None = None
        self._grace_over: asyncio.Event | None = None
        self._slot_free: asyncio.Event | None = None
        self._stop_before_run = False

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
        return [held.ref["job_id"] for held in self._held.values()]

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
        self._held = {}
        signals = self._install_signal_handlers(loop) if install_signal_handlers else []
        client = Client(self.base_url, timeout=self.request_timeout, transport=self.transport)
        self._client = client
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
            self._claimer = None
            self._stop_before_run = False
            logger.info("worker %s stopped", self.worker_id)

    async def _run_loops(self) -> None:
        assert self._stopping is not None
        claimer = asyncio.create_task(self._claim_loop(), name="jobq-claim")
        self._claimer = claimer
        heartbeats = asyncio.create_task(self._heartbeat_loop(), name="jobq-heartbeat")
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
            len(self._held),
            self.grace_seconds,
        )
        self._begin_stop()

    def _begin_stop(self) -> None:
        """Stops claiming now (the in-flight long-poll is cancelled) and tells every handler."""
        assert self._stopping is not None
        self._stopping.set()
        if self._claimer is not None:
            self._claimer.cancel()
        for held in self._held.values():
            held.ctx._stopping = True

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
        while self._held and not self._grace_over.is_set():
            remaining = deadline - self._loop.time()
            if remaining <= 0:
                break
            tasks: set[asyncio.Future[Any]] = {
                held.task for held in self._held.values() if held.task is not None
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
        if self._held:
            logger.warning(
                "worker %s: cancelling %d handlers still running after the grace period",
                self.worker_id,
                len(self._held),
            )
        for held in list(self._held.values()):
            if held.handler_task is not None:
                held.handler_task.cancel()
        supervisors = [held.task for held in self._held.values() if held.task is not None]
        if supervisors:
            await asyncio.wait(supervisors)

    # -- claiming --------------------------------------------------------------------------

    async def _claim_loop(self) -> None:
        assert self._client is not None and self._slot_free is not None and self._loop is not None
        backoff = _Backoff()
        while True:
            free = self.concurrency - len(self._held)
            if free <= 0:
                self._slot_free.clear()
                await self._slot_free.wait()
                continue
            started = self._loop.time()
            try:
                jobs = await self._client.claim(
                    self.worker_id,
                    self.queues,
                    max_jobs=min(free, MAX_CLAIM_JOBS),
                    lease_seconds=self.lease_seconds,
                    wait_seconds=self.wait_seconds,
                )
            except Exception as exc:
                if not _is_transient(exc):
                    logger.error("worker %s: claim refused: %s", self.worker_id, exc)
                    raise
                delay = backoff.next()
                logger.warning(
                    "worker %s: claim failed (%s); retrying in %.1f s",
                    self.worker_id,
                    _describe(exc),
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

    def _start(self, job: dict[str, Any]) -> None:
        held = _Held(job)
        held.ctx = JobContext(job, checkpoint_saver=lambda s, p: self._save_checkpoint(held, s, p))
        held.ctx._stopping = self._stopping is not None and self._stopping.is_set()
        self._held[held.key] = held
        held.task = asyncio.create_task(self._supervise(held), name=f"jobq-job-{job['id']}")
        logger.debug(
            "worker %s: claimed job %s (%s, attempt %s)",
            self.worker_id,
            job["id"],
            job.get("type"),
            job.get("attempt"),
        )

    # -- heartbeats ------------------------------------------------------------------------

    async def _heartbeat_loop(self) -> None:
        """Every ``heartbeat_interval``, one heartbeat request carrying every lease still held."""
        assert self._loop is not None
        delay = self.heartbeat_interval
        while True:
            await asyncio.sleep(delay)
            started = self._loop.time()
            answered = True
            held = [h for h in self._held.values() if not h.lost]
            for first in range(0, len(held), MAX_LEASES_PER_CALL):
                answered &= await self._heartbeat(held[first : first + MAX_LEASES_PER_CALL])
            # Keep the cadence whatever the request took; after a failure, try again sooner.
            interval = self.heartbeat_interval if answered else min(self.heartbeat_interval, 1.0)
            delay = max(0.0, interval - (self._loop.time() - started))

    async def _heartbeat(self, held: list[_Held]) -> bool:
        """One heartbeat request for these leases; answers whether the service answered it."""
        assert self._client is not None
        items = [{**h.ref, "lease_seconds": self.lease_seconds} for h in held]
        try:
            results = await self._client.heartbeat(self.worker_id, items)
        except Exception as exc:
            if not _is_transient(exc):
                logger.exception("worker %s: heartbeat refused", self.worker_id)
                return True
            logger.warning(
                "worker %s: heartbeat of %d leases failed (%s); retrying soon",
                self.worker_id,
                len(items),
                _describe(exc),
            )
            return False
        for h, result in zip(held, results, strict=False):
            if result.get("job_id") == h.ref["job_id"] and not result.get("ok"):
                self._lose(h, result)
        return True

    def _lose(self, held: _Held, result: Mapping[str, Any]) -> None:
        """The service says the lease is gone: stop the handler, and never settle the job."""
        if held.lost or self._held.get(held.key) is not held:
            return
        if held.handler_task is not None and held.handler_task.done():
            # Already completing / failing / releasing: that call will get the verdict itself.
            return
        held.lost = True
        if result.get("cancelled"):
            held.ctx._cancelled = True
        logger.warning(
            "worker %s: job %s %s; cancelling its handler",
            self.worker_id,
            held.ref["job_id"],
            _loss_reason(result),
        )
        if held.handler_task is not None:
            held.handler_task.cancel()

    async def _save_checkpoint(self, held: _Held, state: Any, progress: Any) -> None:
        """``ctx.save_checkpoint``: one heartbeat for this lease carrying the checkpoint."""
        assert self._client is not None
        if held.lost:
            raise LeaseLost(held.ref["job_id"], cancelled=held.ctx.cancelled)
        item: dict[str, Any] = {
            **held.ref,
            "lease_seconds": self.lease_seconds,
            "checkpoint": state,
        }
        if progress is not None:
            item["progress"] = progress
        backoff = _Backoff()
        for attempt in range(1, SAVE_TRIES + 1):
            try:
                [result] = await self._client.heartbeat(self.worker_id, [item])
                break
            except Exception as exc:
                if not _is_transient(exc) or attempt == SAVE_TRIES:
                    raise
                logger.warning(
                    "worker %s: saving job %s's checkpoint failed (%s); retrying",
                    self.worker_id,
                    held.ref["job_id"],
                    _describe(exc),
                )
                await asyncio.sleep(backoff.next())
        if not result.get("ok"):
            cancelled = bool(result.get("cancelled"))
            held.lost = True
            if cancelled:
                held.ctx._cancelled = True
            logger.warning(
                "worker %s: job %s %s while saving its checkpoint",
                self.worker_id,
                held.ref["job_id"],
                _loss_reason(result),
            )
            raise LeaseLost(held.ref["job_id"], cancelled=cancelled)
        held.ctx.checkpoint = state
        if progress is not None:
            held.ctx.progress = progress
        if held.ctx.stopping:
            held.release_checkpoint = True
            raise StopRequested()

    # -- one job ---------------------------------------------------------------------------

    async def _supervise(self, held: _Held) -> None:
        """Runs the job's handler in its own task, then settles the job by what became of it."""
        assert self._slot_free is not None
        job_id = held.ref["job_id"]
        try:
            handler = self._handlers.get(held.ctx.type)
            if handler is None:
                await self._settle(
                    held,
                    "fail",
                    error=(
                        f"no handler for job type {held.ctx.type!r} on worker {self.worker_id} "
                        f"(it handles: {', '.join(self.job_types) or 'nothing'})"
                    ),
                    retryable=False,
                )
                return
            task = asyncio.create_task(_call(handler, held.ctx), name=f"jobq-handler-{job_id}")
            held.handler_task = task
            try:
                await asyncio.wait([task])
            except asyncio.CancelledError:
                task.cancel()
                raise
            await self._conclude(held, task)
        except Exception:
            logger.exception("worker %s: settling job %s failed", self.worker_id, job_id)
        finally:
            self._held.pop(held.key, None)
            self._slot_free.set()

    async def _conclude(self, held: _Held, task: asyncio.Task[Any]) -> None:
        job_id = held.ref["job_id"]
        if held.lost:
            logger.info("worker %s: job %s given up (not held any more)", self.worker_id, job_id)
            if not task.cancelled():
                task.exception()  # retrieved, so asyncio does not log it as never retrieved
            return
        if task.cancelled():
            # The grace period ended (or run() was cancelled): the service keeps the last checkpoint.
            await self._settle(held, "release")
            return
        error = task.exception()
        if error is None:
            await self._complete(held, task.result())
        elif isinstance(error, StopRequested):
            extra = {"checkpoint": held.ctx.checkpoint} if held.release_checkpoint else {}
            await self._settle(held, "release", **extra)
        elif isinstance(error, LeaseLost):
            held.lost = True
        elif isinstance(error, Exception):
            logger.warning(
                "worker %s: job %s failed: %s: %s",
                self.worker_id,
                job_id,
                type(error).__name__,
                error,
                exc_info=error,
            )
            await self._settle(
                held,
                "fail",
                error=f"{type(error).__name__}: {error}"[:ERROR_TEXT_MAX_CHARS],
                retryable=not isinstance(error, NonRetryableError),
            )
        else:
            # Some other BaseException ended the handler: hand the job back untouched.
            logger.error("worker %s: job %s handler raised %r", self.worker_id, job_id, error)
            await self._settle(held, "release")

    async def _complete(self, held: _Held, result: Any) -> None:
        try:
            json.dumps(result, allow_nan=False)
        except (TypeError, ValueError) as exc:
            await self._settle(
                held,
                "fail",
                error=f"the handler's result is not JSON: {type(exc).__name__}: {exc}",
                retryable=False,
            )
            return
        await self._settle(held, "complete", result=result)

    async def _settle(self, held: _Held, operation: str, **fields: Any) -> None:
        """Completes, fails or releases one job, retrying transient errors for a while."""
        assert self._client is not None and self._loop is not None
        call = {
            "complete": self._client.complete,
            "fail": self._client.fail,
            "release": self._client.release,
        }[operation]
        item = {**held.ref, **fields}
        deadline = self._loop.time() + SETTLE_RETRY_SECONDS
        backoff = _Backoff()
        while True:
            try:
                [result] = await call(self.worker_id, [item])
                break
            except Exception as exc:
                if _is_transient(exc) and self._loop.time() < deadline:
                    logger.warning(
                        "worker %s: %s of job %s failed (%s); retrying",
                        self.worker_id,
                        operation,
                        held.ref["job_id"],
                        _describe(exc),
                    )
                    await asyncio.sleep(backoff.next())
                    continue
                if operation == "complete" and isinstance(exc, JobqError) and not exc.transient:
                    # The service will not take this result (too large, say): fail for good.
                    operation, call = "fail", self._client.fail
                    item = {**held.ref, "error": f"complete refused: {exc}", "retryable": False}
                    continue
                raise
        if result.get("ok"):
            logger.debug(
                "worker %s: job %s %s -> %s",
                self.worker_id,
                held.ref["job_id"],
                operation,
                result.get("status"),
            )
        else:
            if result.get("cancelled"):
                held.ctx._cancelled = True
            logger.warning(
                "worker %s: %s of job %s refused: %s",
                self.worker_id,
                operation,
                held.ref["job_id"],
                _loss_reason(result),
            )


async def _call(handler: Handler, ctx: JobContext) -> Any:
    return await handler(ctx)


def _loss_reason(result: Mapping[str, Any]) -> str:
    """Why a lease item was answered ``ok: false``, for the log."""
    if result.get("cancelled"):
        return "was cancelled"
    if result.get("timed_out"):
        return "ran past its timeout_seconds"
    return "lease lost"


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
