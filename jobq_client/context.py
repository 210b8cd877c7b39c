"""``JobContext``: what a handler receives, and the two signals a worker gives it.

A worker tells a running handler two things through its context, each by one method:
:meth:`JobContext.mark_cancelled` when the service says the job was cancelled under this lease,
and :meth:`JobContext.mark_stopping` when the worker begins a graceful stop. The context never
learns how its checkpoint is stored: the worker hands it a ``checkpoint_saver`` for that, which
also records the saved state on the context and raises :class:`StopRequested` once stopping.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from jobq_client.composing import parent_key

# Given ``(state, progress)``: stores them under the lease, records them on the context, and
# raises LeaseLost / StopRequested as ``save_checkpoint`` documents.
CheckpointSaver = Callable[[Any, Any], Awaitable[None]]
# Given a job id: the job as ``GET /v1/jobs/{id}`` answers it (the worker's ``Client.get_job``).
JobReader = Callable[[int], Awaitable[dict[str, Any]]]


class JobContext:
    """What a handler receives: the claimed job, its last checkpoint and the worker's signals.

    ``cancelled`` turns true when the service says the job was cancelled under this lease;
    ``stopping`` turns true when the worker begins a graceful stop. Outside a worker (in a
    handler's own unit tests, say) a context can be built from a job dict alone; its
    ``save_checkpoint`` then only records the state, and :meth:`mark_stopping` /
    :meth:`mark_cancelled` let the test play the worker's part.

    A job that waited for others (``depends_on``, a workflow step, a batch's callback) learns
    how they ended from :attr:`parents` and :attr:`parent_results`.
    """

    def __init__(
        self,
        job: Mapping[str, Any],
        *,
        checkpoint_saver: CheckpointSaver | None = None,
        job_reader: JobReader | None = None,
    ) -> None:
        self.job: dict[str, Any] = dict(job)
        self.checkpoint: Any = self.job.get("checkpoint")
        self.progress: Any = self.job.get("progress")
        self._saver = checkpoint_saver
        self._reader = job_reader
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
    def parents(self) -> dict[str, Any] | None:
        """What the claim said of the jobs this one waited for; ``None`` for a job that waited
        for none.

        ``{"total", "succeeded", "dead", "cancelled", "failed_ids": [...], "jobs": [{"id",
        "step", "status", "result", "result_by_reference", "result_hidden"}, ...]}``, the jobs
        in ``depends_on`` order (a batch's callback: the batch's jobs). ``status`` is
        ``succeeded``, ``dead``, ``cancelled``, or ``deleted`` for a parent gone since. A result
        too large to come inline has ``result_by_reference: true`` and ``result: null``: see
        :meth:`fetch_parent_results`. A parent in a queue the worker's API key may not read
        has ``result_hidden: true``: only its id and state are told.
        """
        parents: dict[str, Any] | None = self.job.get("parents")
        return parents

    @property
    def parent_results(self) -> dict[str | int, Any]:
        """Each parent's result, keyed by its step name in a workflow, else by its job id.

        Only results that came inline with the claim: a parent whose result is too large
        (``result_by_reference``) is left out, as is a job's result when it waited for none
        (the mapping is then empty). :meth:`fetch_parent_results` reads those too. A parent
        whose result the worker's key may not read (``result_hidden``) is left out of both.
        """
        return {
            parent_key(parent): parent.get("result")
            for parent in (self.parents or {}).get("jobs", [])
            if not parent.get("result_by_reference") and not parent.get("result_hidden")
        }

    async def fetch_parent_results(self) -> dict[str | int, Any]:
        """:attr:`parent_results` with the results too large to come inline read by job id
        (``GET /v1/jobs/{id}``, through the worker's client; a parent deleted meanwhile raises
        :class:`JobqError` 404).

        Raises ``RuntimeError`` outside a worker when some result is by reference (a context
        built from a dict alone has no client to read it with).
        """
        results = self.parent_results
        for parent in (self.parents or {}).get("jobs", []):
            if not parent.get("result_by_reference") or parent.get("result_hidden"):
                continue
            if self._reader is None:
                raise RuntimeError("this context has no client to read results by reference")
            job = await self._reader(int(parent["id"]))
            results[parent_key(parent)] = job.get("result")
        return results

    @property
    def cancelled(self) -> bool:
        """Whether the job was cancelled while this handler ran (its task is cancelled too)."""
        return self._cancelled

    @property
    def stopping(self) -> bool:
        """Whether the worker is shutting down: save a checkpoint and the job is handed back."""
        return self._stopping

    def mark_cancelled(self) -> None:
        """Records that the service cancelled the job under this lease; ``cancelled`` turns true."""
        self._cancelled = True

    def mark_stopping(self) -> None:
        """Records that the worker is stopping; ``stopping`` turns true."""
        self._stopping = True

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
