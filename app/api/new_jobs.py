"""The queue core's view of enqueue requests: a NewJob per request (or workflow step), PlainJobs
for a batch that needs only its insert, and the fingerprints that tell an idempotent replay from a
reuse (of a job's key, and of a workflow's)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import replace

from app.api.schemas import BatchCallback, EnqueueRequest, JobTemplate
from app.api.workflow_models import WorkflowRequest
from app.domain.types import NewJob, PlainJobs

_LATER_FIELDS = ("callback_url", "depends_on", "on_parent_failure", "ordering_key")


def request_fingerprint(request: EnqueueRequest) -> str:
    """A stable hash of an enqueue request (without its key), to tell a replay from a reuse."""
    # Fields newer than a key's job are left out while unset, so a replay of a request made
    # before they existed still matches its job's fingerprint.
    unset = {f for f in _LATER_FIELDS if getattr(request, f, None) is None}
    body = request.model_dump(mode="json", exclude={"idempotency_key", *unset})
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def workflow_fingerprint(request: WorkflowRequest) -> str:
    """A stable hash of a workflow create (without its key), to tell a replay from a reuse.

    Fields left at their defaults are left out, so a field added later (with a default) keeps
    the fingerprints of requests made before it, and ``{"priority": 0}`` is the same request as
    no priority.
    """
    body = request.model_dump(mode="json", exclude={"idempotency_key"}, exclude_defaults=True)
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def new_job(
    request: JobTemplate, *, traceparent: str | None = None, key_id: int | None = None
) -> NewJob:
    """The queue core's view of an enqueue request or a workflow step (and the trace context its
    jobs keep); the caller's API key ``key_id`` signs the job's webhooks, if it gets a callback.
    Only an :class:`EnqueueRequest` carries an idempotency key, parents or an ordering key."""
    links = request if isinstance(request, EnqueueRequest) else None
    key = links.idempotency_key if links is not None else None
    return NewJob(
        queue=request.queue,
        type=request.type,
        payload=request.payload,
        priority=request.priority,
        run_at=request.run_at,
        delay_seconds=request.delay_seconds,
        max_attempts=request.max_attempts,
        lease_seconds=request.lease_seconds,
        timeout_seconds=request.timeout_seconds,
        concurrency_key=request.concurrency_key,
        idempotency_key=key,
        fingerprint=request_fingerprint(links) if links is not None and key else None,
        traceparent=traceparent,
        depends_on=(
            tuple(links.depends_on) if links is not None and links.depends_on is not None else None
        ),
        on_parent_failure=request.on_parent_failure,
        ordering_key=links.ordering_key if links is not None else None,
        callback_url=request.callback_url,
        callback_key_id=key_id,
    )


def plain_jobs(
    requests: Sequence[EnqueueRequest],
    *,
    traceparent: str | None = None,
    key_id: int | None = None,
) -> PlainJobs | None:
    """The queue core's view of a batch whose jobs need only their insert (see
    :class:`~app.domain.types.PlainJobs`), or ``None`` when one has an idempotency key, parents
    or an ordering key: each item is the fields its producer set, read off the validated model
    (explicit nulls included; the statement reads them as left out)."""
    items = []
    for request in requests:
        if request.idempotency_key is not None or request.depends_on is not None:
            return None
        if request.ordering_key is not None:
            return None
        items.append({name: getattr(request, name) for name in request.model_fields_set})
    return PlainJobs(items, traceparent=traceparent, callback_key_id=key_id)


def new_callback(
    request: BatchCallback, *, traceparent: str | None = None, key_id: int | None = None
) -> NewJob:
    """The queue core's view of a batch callback (its parents are filled in by the core)."""
    job = new_job(request, traceparent=traceparent, key_id=key_id)
    return replace(job, on_parent_failure="run" if request.when == "all_finished" else "cancel")
