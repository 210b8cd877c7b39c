"""The client's exceptions: HTTP problems, a wait (for a job or a workflow) that timed out, handler verdicts, and the two ways a handler is stopped."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class JobqError(Exception):
    """An error answer (4xx / 5xx) from the service, carrying its RFC 9457 problem details."""

    def __init__(self, status: int, problem: Mapping[str, Any]) -> None:
        self.status = status
        self.problem: dict[str, Any] = dict(problem)
        super().__init__(status, self.problem)

    @property
    def title(self) -> str | None:
        """The problem's ``title``, if it has one."""
        value = self.problem.get("title")
        return value if isinstance(value, str) else None

    @property
    def detail(self) -> str | None:
        """The problem's ``detail``, if it has one."""
        value = self.problem.get("detail")
        return value if isinstance(value, str) else None

    @property
    def errors(self) -> list[Any]:
        """The problem's per-field ``errors`` (``[{"field": ..., "message": ...}]``), if any."""
        value = self.problem.get("errors")
        return list(value) if isinstance(value, list) else []

    @property
    def transient(self) -> bool:
        """Whether repeating the same request later may succeed (5xx, 408, 429)."""
        return self.status >= 500 or self.status in (408, 429)

    def _describe(self) -> str:
        text = f"{self.status} {self.title or 'Error'}"
        if self.detail:
            text += f": {self.detail}"
        fields = [
            f"{e.get('field')}: {e.get('message')}" if isinstance(e, Mapping) else str(e)
            for e in self.errors
        ]
        if fields:
            text += f" [{'; '.join(fields)}]"
        return text

    def __str__(self) -> str:
        return self._describe()


class WaitTimeout(TimeoutError):
    """The job did not finish within the time ``Client.wait`` was given.

    ``job`` is the job as the service last answered it (unfinished), or ``None`` when no answer
    came at all (every try failed with a transient error, the last of which is the cause).
    """

    def __init__(self, job_id: int, timeout: float, job: Mapping[str, Any] | None) -> None:
        self.job_id = job_id
        self.timeout = timeout
        self.job: dict[str, Any] | None = None if job is None else dict(job)
        status = "no answer" if job is None else f"still {job.get('status')}"
        super().__init__(f"job {job_id} not finished after {timeout:g} s ({status})")


class WorkflowWaitTimeout(TimeoutError):
    """The workflow did not finish within the time ``Client.wait_workflow`` was given.

    ``workflow`` is the workflow as the service last answered it (``state`` still
    ``running``), or ``None`` when no answer came at all (every try failed with a transient
    error, the last of which is the cause). The workflow goes on; waiting again is fine.
    """

    def __init__(
        self, workflow_id: int, timeout: float, workflow: Mapping[str, Any] | None
    ) -> None:
        self.workflow_id = workflow_id
        self.timeout = timeout
        self.workflow: dict[str, Any] | None = None if workflow is None else dict(workflow)
        if workflow is None:
            state = "no answer"
        else:
            counts = ", ".join(
                f"{n} {s}" for s, n in sorted((workflow.get("counts") or {}).items())
            )
            state = f"still {workflow.get('state')}: {counts}"
        super().__init__(f"workflow {workflow_id} not finished after {timeout:g} s ({state})")


class NonRetryableError(Exception):
    """Raised by a handler to fail its job for good: the job goes to ``dead`` without retries."""


class LeaseLost(BaseException):
    """The worker no longer holds the job's lease (reaped, taken over or cancelled); stop working.

    It derives from ``BaseException`` so a handler's ``except Exception`` does not swallow it:
    work done past this point is work another worker may be doing too.
    """

    def __init__(self, job_id: int, *, cancelled: bool = False) -> None:
        self.job_id = job_id
        self.cancelled = cancelled
        reason = "cancelled" if cancelled else "lease lost"
        super().__init__(f"job {job_id}: {reason}")


class StopRequested(BaseException):
    """The worker is shutting down and the handler's checkpoint was saved: the job will be released.

    Raised by ``JobContext.save_checkpoint`` once the worker is stopping; it derives from
    ``BaseException`` so that ``except Exception`` in a handler lets it through.
    """
