"""Composing work: workflow steps, a batch's callback, and what an enqueued batch answers.

Plain values the :class:`~jobq_client.Client` turns into request bodies:

- :class:`Step`: one step of ``Client.workflow`` (a job template, its name and the steps it runs
  ``after``); a plain dict with the same keys works too;
- :class:`Callback`: the job ``Client.enqueue_batch(..., callback=...)`` adds to a batch, due
  once every job of the batch succeeded (``when="all_succeeded"``) or ended at all
  (``"all_finished"``); a plain dict works too;
- :class:`EnqueuedBatch`: the list of jobs ``enqueue_batch`` answers, carrying the callback job
  as ``.callback`` (``None`` without one), so code written for a plain list keeps working.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

OnParentFailure = Literal["cancel", "run"]
CallbackWhen = Literal["all_succeeded", "all_finished"]
# A workflow is running while any step is open; these are the states it ends in.
WORKFLOW_FINISHED = frozenset({"succeeded", "failed", "cancelled"})


def drop_unset(values: Mapping[str, Any]) -> dict[str, Any]:
    """The items whose value is not ``None`` (the service's default then applies)."""
    return {k: v for k, v in values.items() if v is not None}


def job_ids(ids: Iterable[int] | None) -> list[int] | None:
    """``depends_on`` as the wire takes it: a list of ints (None stays None, so it is left out)."""
    return None if ids is None else [int(i) for i in ids]


@dataclass(frozen=True)
class Step:
    """One step of a workflow: a job template, its name, and the names of the steps it runs after.

    The step becomes due once every step in ``after`` succeeded (or, with
    ``on_parent_failure="run"``, ended at all); a step without ``after`` is due at once. Its
    handler reads the parents' results from ``ctx.parent_results`` (keyed by step name).
    ``run_at`` takes an aware datetime or an ISO 8601 string.
    """

    name: str
    type: str
    after: Sequence[str] = ()
    payload: Any = None
    queue: str = "default"
    priority: int | None = None
    delay_seconds: float | None = None
    run_at: datetime | str | None = None
    max_attempts: int | None = None
    lease_seconds: int | None = None
    timeout_seconds: int | None = None
    concurrency_key: str | None = None
    on_parent_failure: OnParentFailure | None = None

    def to_json(self, jsonable_time: Callable[[datetime | str], str]) -> dict[str, Any]:
        """The step as ``POST /v1/workflows`` takes it (unset options left out)."""
        body: dict[str, Any] = {
            "name": self.name,
            "type": self.type,
            "queue": self.queue,
            "payload": self.payload,
            "after": list(self.after),
        }
        body.update(
            drop_unset(
                {
                    "priority": self.priority,
                    "delay_seconds": self.delay_seconds,
                    "run_at": None if self.run_at is None else jsonable_time(self.run_at),
                    "max_attempts": self.max_attempts,
                    "lease_seconds": self.lease_seconds,
                    "timeout_seconds": self.timeout_seconds,
                    "concurrency_key": self.concurrency_key,
                    "on_parent_failure": self.on_parent_failure,
                }
            )
        )
        return body


@dataclass(frozen=True)
class Callback:
    """The job a batch enqueues to run after all of it: ``when`` its jobs all succeeded (if one
    ends dead or cancelled the callback is cancelled) or ``all_finished`` (it runs whatever they
    ended as). Its handler finds the counts and the failed ids in ``ctx.parents``.

    ``extra`` carries any other enqueue field (``idempotency_key``, ``run_at``, ...) as is.
    """

    type: str
    payload: Any = None
    when: CallbackWhen = "all_succeeded"
    queue: str = "default"
    priority: int | None = None
    max_attempts: int | None = None
    lease_seconds: int | None = None
    timeout_seconds: int | None = None
    concurrency_key: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The callback as ``POST /v1/jobs/batch`` takes it (unset options left out)."""
        body: dict[str, Any] = {
            "type": self.type,
            "queue": self.queue,
            "payload": self.payload,
            "when": self.when,
        }
        body.update(
            drop_unset(
                {
                    "priority": self.priority,
                    "max_attempts": self.max_attempts,
                    "lease_seconds": self.lease_seconds,
                    "timeout_seconds": self.timeout_seconds,
                    "concurrency_key": self.concurrency_key,
                }
            )
        )
        body.update(self.extra)
        return body


class EnqueuedBatch(list[dict[str, Any]]):
    """The jobs of a batch in the order sent (a list, as ``enqueue_batch`` always answered), with
    the batch's callback job as ``callback`` (``None`` when the batch named none)."""

    def __init__(self, jobs: Iterable[dict[str, Any]], callback: dict[str, Any] | None) -> None:
        super().__init__(jobs)
        self.callback = callback


def parent_key(parent: Mapping[str, Any]) -> str | int:
    """How ``ctx.parent_results`` names a parent: its step name in a workflow, else its job id."""
    step = parent.get("step")
    if isinstance(step, str):
        return step
    job_id: int = parent["id"]
    return job_id


def open_step_job(workflow: Mapping[str, Any]) -> int | None:
    """The job id of the last step still open (not succeeded, dead or cancelled), or None.

    The last one in creation order is the deepest: waiting for it usually waits out the others.
    """
    for step in reversed(workflow.get("steps") or []):
        job = step.get("job") or {}
        if job.get("status") not in ("succeeded", "dead", "cancelled"):
            job_id: int = job["id"]
            return job_id
    return None
