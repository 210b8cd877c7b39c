"""``LeaseKeeper``: the leases a worker holds, their batched heartbeats, checkpoints and settling.

- Heartbeats: every ``heartbeat_interval`` one ``POST /v1/heartbeat`` carries every held lease
  (split only past the service's per-call limit). An item answered ``ok: false`` (lease lost, the
  job cancelled or past its ``timeout_seconds``) marks the job lost and cancels its handler; a
  lost job is left out of later heartbeats and never completed, failed or released.
- Checkpoints: ``ctx.save_checkpoint`` is one heartbeat for that lease carrying the checkpoint,
  so it is stored only while the lease is held.
- Settling: once a handler has ended, :meth:`LeaseKeeper.settle` completes (returned), fails
  (raised) or releases (stopped, or cancelled by the worker) its job, retrying transient errors
  for a while. Only ``ok`` in an answer decides anything; ``status`` is only logged, as the
  service may name the same outcome differently (``pending`` or ``scheduled`` after a failure).
  The worker may have the call claim its next jobs too (``claim_next``): only the first try
  carries it (a repeat could lease jobs a second time whose first answer was lost), and an
  error answer to it is sent again without it, so the job is settled whatever the claim met.
  :meth:`LeaseKeeper.complete_many` completes several jobs in one request the same way.

The worker owns the claim loop and the run / stop / drain lifecycle; it calls :meth:`hold` for
each claimed job, runs the handler, then calls :meth:`settle` and :meth:`drop`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import traceback
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from jobq_client.client import Client
from jobq_client.context import JobContext, JobReader
from jobq_client.errors import JobqError, LeaseLost, NonRetryableError, StopRequested
from jobq_client.retry import Backoff, describe, is_transient

# The worker's logger: its lease messages are the worker's, and logging setups name it.
logger = logging.getLogger("jobq_client.worker")

MAX_LEASES_PER_CALL = 1000  # the service's limit of lease items per call
SAVE_TRIES = 3  # transient failures of save_checkpoint's heartbeat before the error is raised
SETTLE_RETRY_SECONDS = 10.0  # how long complete / fail / release are retried on transient errors
ERROR_TEXT_MAX_CHARS = 65536  # the service's limit for a fail item's ``error``
ERROR_TYPE_MAX_CHARS = 200  # the service refuses a longer exception type name
TRACEBACK_MAX_CHARS = 16000  # the service keeps this much of a traceback's end


def error_detail(error: BaseException) -> dict[str, Any]:
    """An exception as ``POST /v1/fail`` takes it: its type, its message and its traceback (the
    end of it, where the exception line is)."""
    kind = type(error)
    name = (
        kind.__qualname__
        if kind.__module__ == "builtins"
        else f"{kind.__module__}.{kind.__qualname__}"
    )
    text = "".join(traceback.format_exception(error))
    return {
        "type": name[-ERROR_TYPE_MAX_CHARS:],
        "message": str(error)[:ERROR_TEXT_MAX_CHARS],
        "traceback": text[-TRACEBACK_MAX_CHARS:],
    }


class HeldJob:
    """One job a worker holds: its lease, its context, its tasks and what became of it."""

    __slots__ = ("ctx", "handler_task", "lost", "ref", "release_checkpoint", "task")

    def __init__(
        self,
        job: Mapping[str, Any],
        save: Callable[[HeldJob, Any, Any], Awaitable[None]],
        read: JobReader | None = None,
    ) -> None:
        self.ref: dict[str, Any] = {"job_id": job["id"], "lease_id": job["lease_id"]}
        self.ctx = JobContext(
            job,
            checkpoint_saver=lambda state, progress: save(self, state, progress),
            job_reader=read,
        )
        self.task: asyncio.Task[None] | None = None  # the worker's supervisor of this job
        self.handler_task: asyncio.Task[Any] | None = None
        self.lost = False
        self.release_checkpoint = False

    @property
    def key(self) -> tuple[int, str]:
        """The job and lease ids: a job claimed again after a loss is a different lease."""
        return (self.ref["job_id"], self.ref["lease_id"])


class LeaseKeeper:
    """Keeps a worker's leases: heartbeats them in batches, saves checkpoints and settles jobs."""

    def __init__(
        self,
        client: Client,
        *,
        worker_id: str,
        lease_seconds: int,
        heartbeat_interval: float,
    ) -> None:
        self._client = client
        self.worker_id = worker_id
        self.lease_seconds = lease_seconds
        self.heartbeat_interval = heartbeat_interval
        self._held: dict[tuple[int, str], HeldJob] = {}
        # The service refused a claim_next (one from before it, say): settle without it from now.
        self.claim_next_refused = False

    def __len__(self) -> int:
        return len(self._held)

    def jobs(self) -> list[HeldJob]:
        """The jobs held now, as a list that stays valid while jobs come and go."""
        return list(self._held.values())

    def hold(self, job: Mapping[str, Any]) -> HeldJob:
        """Starts keeping the lease of a just claimed job; answers its record."""
        held = HeldJob(job, self._save_checkpoint, self._client.get_job)
        self._held[held.key] = held
        return held

    def drop(self, held: HeldJob) -> None:
        """Stops keeping the job's lease: it was settled, given up or handed back."""
        self._held.pop(held.key, None)

    # -- heartbeats ------------------------------------------------------------------------

    async def run_heartbeats(self) -> None:
        """Every ``heartbeat_interval``, one heartbeat request carrying every lease still held."""
        loop = asyncio.get_running_loop()
        delay = self.heartbeat_interval
        while True:
            await asyncio.sleep(delay)
            started = loop.time()
            answered = True
            held = [h for h in self._held.values() if not h.lost]
            for first in range(0, len(held), MAX_LEASES_PER_CALL):
                answered &= await self._heartbeat(held[first : first + MAX_LEASES_PER_CALL])
            # Keep the cadence whatever the request took; after a failure, try again sooner.
            interval = self.heartbeat_interval if answered else min(self.heartbeat_interval, 1.0)
            delay = max(0.0, interval - (loop.time() - started))

    async def _heartbeat(self, held: list[HeldJob]) -> bool:
        """One heartbeat request for these leases; answers whether the service answered it."""
        items = [{**h.ref, "lease_seconds": self.lease_seconds} for h in held]
        try:
            results = await self._client.heartbeat(self.worker_id, items)
        except Exception as exc:
            if not is_transient(exc):
                logger.exception("worker %s: heartbeat refused", self.worker_id)
                return True
            logger.warning(
                "worker %s: heartbeat of %d leases failed (%s); retrying soon",
                self.worker_id,
                len(items),
                describe(exc),
            )
            return False
        for h, result in zip(held, results, strict=False):
            if result.get("job_id") == h.ref["job_id"] and not result.get("ok"):
                self._lose(h, result)
        return True

    def _lose(self, held: HeldJob, result: Mapping[str, Any]) -> None:
        """The service says the lease is gone: stop the handler, and never settle the job."""
        if held.lost or self._held.get(held.key) is not held:
            return
        if held.handler_task is not None and held.handler_task.done():
            # Already completing / failing / releasing: that call will get the verdict itself.
            return
        held.lost = True
        if result.get("cancelled"):
            held.ctx.mark_cancelled()
        logger.warning(
            "worker %s: job %s %s; cancelling its handler",
            self.worker_id,
            held.ref["job_id"],
            _loss_reason(result),
        )
        if held.handler_task is not None:
            held.handler_task.cancel()

    # -- checkpoints -----------------------------------------------------------------------

    async def _save_checkpoint(self, held: HeldJob, state: Any, progress: Any) -> None:
        """``ctx.save_checkpoint``'s saver: one heartbeat for this lease carrying the checkpoint."""
        if held.lost:
            raise LeaseLost(held.ref["job_id"], cancelled=held.ctx.cancelled)
        item: dict[str, Any] = {
            **held.ref,
            "lease_seconds": self.lease_seconds,
            "checkpoint": state,
        }
        if progress is not None:
            item["progress"] = progress
        backoff = Backoff()
        for attempt in range(1, SAVE_TRIES + 1):
            try:
                [result] = await self._client.heartbeat(self.worker_id, [item])
                break
            except Exception as exc:
                if not is_transient(exc) or attempt == SAVE_TRIES:
                    raise
                logger.warning(
                    "worker %s: saving job %s's checkpoint failed (%s); retrying",
                    self.worker_id,
                    held.ref["job_id"],
                    describe(exc),
                )
                await asyncio.sleep(backoff.next())
        if not result.get("ok"):
            cancelled = bool(result.get("cancelled"))
            held.lost = True
            if cancelled:
                held.ctx.mark_cancelled()
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
            # Saved, so the release hands this checkpoint on, and the next worker starts from it.
            held.release_checkpoint = True
            raise StopRequested()

    # -- settling --------------------------------------------------------------------------

    async def settle(
        self,
        held: HeldJob,
        handler_task: asyncio.Task[Any],
        *,
        claim_next: Mapping[str, Any] | None = None,
    ) -> list[dict[str, Any]]:
        """Completes, fails or releases the job according to how its handler task ended.

        ``claim_next`` (a claim's fields but the worker) has the same request claim the worker's
        next jobs; answers them (none when the job was given up or the claim took nothing).
        """
        job_id = held.ref["job_id"]
        if held.lost:
            logger.info("worker %s: job %s given up (not held any more)", self.worker_id, job_id)
            if not handler_task.cancelled():
                handler_task.exception()  # retrieved, so asyncio does not log it as never retrieved
            return []
        if handler_task.cancelled():
            # The grace period ended (or run() was cancelled): the service keeps the last checkpoint.
            return await self._send(held, "release", claim_next)
        error = handler_task.exception()
        if error is None:
            return await self._complete(held, handler_task.result(), claim_next)
        if isinstance(error, StopRequested):
            extra = {"checkpoint": held.ctx.checkpoint} if held.release_checkpoint else {}
            return await self._send(held, "release", claim_next, **extra)
        if isinstance(error, LeaseLost):
            held.lost = True
            return []
        if isinstance(error, Exception):
            logger.warning(
                "worker %s: job %s failed: %s: %s",
                self.worker_id,
                job_id,
                type(error).__name__,
                error,
                exc_info=error,
            )
            return await self.fail(
                held,
                error=error_detail(error),
                retryable=not isinstance(error, NonRetryableError),
                claim_next=claim_next,
            )
        # Some other BaseException ended the handler: hand the job back untouched.
        logger.error("worker %s: job %s handler raised %r", self.worker_id, job_id, error)
        return await self._send(held, "release", claim_next)

    async def fail(
        self,
        held: HeldJob,
        *,
        error: str | dict[str, Any],
        retryable: bool,
        claim_next: Mapping[str, Any] | None = None,
    ) -> list[dict[str, Any]]:
        """Fails the job's attempt: retried after the service's backoff, or dead when not retryable.

        ``error`` is text, or the exception as :func:`error_detail` describes it. Answers the jobs
        ``claim_next`` claimed.
        """
        return await self._send(held, "fail", claim_next, error=error, retryable=retryable)

    async def release(
        self,
        held: HeldJob,
        *,
        delay_seconds: float = 0,
        claim_next: Mapping[str, Any] | None = None,
    ) -> list[dict[str, Any]]:
        """Hands the job back without charging the attempt, claimable again after ``delay_seconds``.

        Answers the jobs ``claim_next`` claimed.
        """
        return await self._send(held, "release", claim_next, delay_seconds=delay_seconds)

    async def complete_many(
        self,
        done: Sequence[tuple[HeldJob, Any]],
        *,
        claim_next: Mapping[str, Any] | None = None,
    ) -> list[dict[str, Any]]:
        """Completes several jobs, each with its handler's JSON result, in one request.

        Retried as :meth:`settle` retries one job's (``claim_next`` only on the first try). When
        the service refuses the request for good (one result too large, say), each job is
        completed on its own instead, so only the job the service refuses is failed. Answers the
        jobs ``claim_next`` claimed.
        """
        loop = asyncio.get_running_loop()
        items = [{**held.ref, "result": result} for held, result in done]
        deadline = loop.time() + SETTLE_RETRY_SECONDS
        backoff = Backoff()
        while True:
            ask, claim_next = claim_next, None
            try:
                results = await self._client.complete(self.worker_id, items, claim_next=ask)
                break
            except Exception as exc:
                if ask is not None and isinstance(exc, JobqError) and not exc.transient:
                    self._claim_next_refused(exc)
                    continue
                if is_transient(exc) and loop.time() < deadline:
                    logger.warning(
                        "worker %s: complete of %d jobs failed (%s); retrying",
                        self.worker_id,
                        len(items),
                        describe(exc),
                    )
                    await asyncio.sleep(backoff.next())
                    continue
                if isinstance(exc, JobqError) and not exc.transient and len(done) > 1:
                    for held, result in done:
                        await self._complete(held, result, None)
                    return []
                raise
        for (held, _), result in zip(done, results, strict=True):
            self._settled(held, "complete", result)
        if results.claim_error is not None:
            logger.warning(
                "worker %s: the claim after completing %d jobs failed: %s",
                self.worker_id,
                len(items),
                results.claim_error,
            )
        return list(results.claimed or [])

    async def _complete(
        self, held: HeldJob, result: Any, claim_next: Mapping[str, Any] | None
    ) -> list[dict[str, Any]]:
        try:
            json.dumps(result, allow_nan=False)
        except (TypeError, ValueError) as exc:
            return await self.fail(
                held,
                error=f"the handler's result is not JSON: {type(exc).__name__}: {exc}",
                retryable=False,
                claim_next=claim_next,
            )
        return await self._send(held, "complete", claim_next, result=result)

    async def _send(
        self,
        held: HeldJob,
        operation: str,
        claim_next: Mapping[str, Any] | None = None,
        **fields: Any,
    ) -> list[dict[str, Any]]:
        """Completes, fails or releases one job, retrying transient errors for a while; answers
        the jobs its ``claim_next`` claimed."""
        loop = asyncio.get_running_loop()
        call = {
            "complete": self._client.complete,
            "fail": self._client.fail,
            "release": self._client.release,
        }[operation]
        item = {**held.ref, **fields}
        deadline = loop.time() + SETTLE_RETRY_SECONDS
        backoff = Backoff()
        while True:
            # Only the first try claims: the claim loop covers the slot once the job is settled.
            ask, claim_next = claim_next, None
            try:
                results = await call(self.worker_id, [item], claim_next=ask)
                [result] = results
                break
            except Exception as exc:
                if ask is not None and isinstance(exc, JobqError) and not exc.transient:
                    self._claim_next_refused(exc)
                    continue  # the settle on its own, whatever the claim was refused for
                if is_transient(exc) and loop.time() < deadline:
                    logger.warning(
                        "worker %s: %s of job %s failed (%s); retrying",
                        self.worker_id,
                        operation,
                        held.ref["job_id"],
                        describe(exc),
                    )
                    await asyncio.sleep(backoff.next())
                    continue
                if operation == "complete" and isinstance(exc, JobqError) and not exc.transient:
                    # The service will not take this result (too large, say): fail for good.
                    operation, call = "fail", self._client.fail
                    item = {**held.ref, "error": f"complete refused: {exc}", "retryable": False}
                    continue
                raise
        self._settled(held, operation, result)
        if results.claim_error is not None:
            logger.warning(
                "worker %s: the claim after %s of job %s failed: %s",
                self.worker_id,
                operation,
                held.ref["job_id"],
                results.claim_error,
            )
        return list(results.claimed or [])

    def _settled(self, held: HeldJob, operation: str, result: Mapping[str, Any]) -> None:
        """Logs the service's verdict on one settled job (a refusal says why)."""
        if result.get("ok"):
            logger.debug(
                "worker %s: job %s %s -> %s",
                self.worker_id,
                held.ref["job_id"],
                operation,
                result.get("status"),
            )
            return
        if result.get("cancelled"):
            held.ctx.mark_cancelled()
        logger.warning(
            "worker %s: %s of job %s refused: %s",
            self.worker_id,
            operation,
            held.ref["job_id"],
            _loss_reason(result),
        )

    def _claim_next_refused(self, error: JobqError) -> None:
        """A settle carrying ``claim_next`` was refused: it goes again without. A service that
        names the field does not take it (or not from this worker): none is sent any more."""
        fields = [str(e.get("field")) for e in error.errors if isinstance(e, Mapping)]
        if any(field.startswith("body.claim_next") for field in fields):
            if not self.claim_next_refused:
                logger.warning(
                    "worker %s: the service refuses claim_next (%s); claiming on its own",
                    self.worker_id,
                    error,
                )
            self.claim_next_refused = True


def _loss_reason(result: Mapping[str, Any]) -> str:
    """Why a lease item was answered ``ok: false``, for the log."""
    if result.get("cancelled"):
        return "was cancelled"
    if result.get("timed_out"):
        return "ran past its timeout_seconds"
    return "lease lost"
