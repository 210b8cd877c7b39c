"""ProducerStore: the statements of ``sql/producers.sql``, one method each."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from app.domain.records import Job, JobHead
from app.domain.types import EnqueueLimits, JobDefaults, NewJob, PlainJobs
from app.store.conn import Conn, to_json


def enqueue_params(job: NewJob) -> dict[str, Any]:
    """A job as the enqueue statements read it (job_enqueue, schedule_run_enqueue)."""
    params: dict[str, Any] = {
        "queue": job.queue,
        "type": job.type,
        "payload": job.payload,
        "priority": job.priority,
        "max_attempts": job.max_attempts,
        "lease_seconds": job.lease_seconds,
        "timeout_seconds": job.timeout_seconds,
        "run_at": job.run_at.isoformat() if job.run_at is not None else None,
        "delay_seconds": job.delay_seconds,
        "idempotency_key": job.idempotency_key,
        "concurrency_key": job.concurrency_key,
        "traceparent": job.traceparent,
        "callback_url": job.callback_url,
        "callback_key_id": job.callback_key_id,
        "idempotency_hash": job.fingerprint if job.idempotency_key is not None else None,
    }
    # Composing work (migration 0021): sent only when set, so a plain job's items stay as small
    # as before (the statement reads an absent key as NULL).
    if job.depends_on is not None:
        params["depends_on"] = job.depends_on
        params["on_parent_failure"] = job.on_parent_failure
    if job.ordering_key is not None:
        params["ordering_key"] = job.ordering_key
    if job.workflow_id is not None:
        params["id"] = job.id
        params["workflow_id"] = job.workflow_id
        params["workflow_step"] = job.workflow_step
        params["has_dependents"] = job.has_dependents
    return params


def _statement_params(
    jobs: Sequence[NewJob] | PlainJobs, defaults: JobDefaults | None
) -> dict[str, Any]:
    """The enqueue statements' parameters: the items, and the call-wide values that fill in
    what plain items leave out (NULL for NewJobs, whose items carry their own)."""
    if isinstance(jobs, PlainJobs):
        if defaults is None:
            raise ValueError("plain jobs take their defaults from the call: give defaults")
        return {
            "items": to_json(jobs.items),
            "traceparent": jobs.traceparent,
            "callback_key_id": jobs.callback_key_id,
            "max_attempts": defaults.max_attempts,
            "lease_seconds": defaults.lease_seconds,
        }
    return {
        "items": to_json([enqueue_params(job) for job in jobs]),
        "traceparent": None,
        "callback_key_id": None,
        "max_attempts": None,
        "lease_seconds": None,
    }


class ProducerStore:
    """Runs the enqueue statements: the API's, and the bounds of ``jobq.enqueue()``, the enqueue
    of producers sharing the database."""

    async def job_enqueue(
        self, conn: Conn, *, jobs: Sequence[NewJob] | PlainJobs, defaults: JobDefaults | None = None
    ) -> list[Job | None]:
        """Inserts jobs in order; ``None`` where the job's idempotency key already exists.
        Plain jobs go as they are, taking ``defaults`` for what they leave out."""
        rows = await conn.fetch("job_enqueue", _statement_params(jobs, defaults))
        return [Job.from_row(row) if row["id"] is not None else None for row in rows]

    async def job_enqueue_ids(
        self, conn: Conn, *, jobs: Sequence[NewJob] | PlainJobs, defaults: JobDefaults | None = None
    ) -> list[JobHead | None]:
        """As :meth:`job_enqueue`, answering only each created job's head."""
        rows = await conn.fetch("job_enqueue_ids", _statement_params(jobs, defaults))
        return [JobHead.from_row(row) if row["id"] is not None else None for row in rows]

    async def job_enqueue_plain(
        self, conn: Conn, *, jobs: PlainJobs, defaults: JobDefaults
    ) -> list[JobHead]:
        """As :meth:`job_enqueue_ids` for plain jobs, which no key can make skipped."""
        rows = await conn.fetch("job_enqueue_plain", _statement_params(jobs, defaults))
        return [JobHead.from_row(row) for row in rows]

    async def job_get_by_idempotency_keys(
        self, conn: Conn, *, keys: Sequence[tuple[str, str]]
    ) -> dict[tuple[str, str], Job]:
        """The jobs holding the given (queue, idempotency_key) pairs."""
        payload = [{"queue": q, "idempotency_key": k} for q, k in keys]
        rows = await conn.fetch("job_get_by_idempotency_keys", {"keys": to_json(payload)})
        jobs = [Job.from_row(row) for row in rows]
        return {(job.queue, job.idempotency_key or ""): job for job in jobs}

    async def enqueue_limits_set(self, conn: Conn, *, limits: EnqueueLimits) -> None:
        """Writes the bounds and defaults ``jobq.enqueue()`` applies (unchanged ones are kept)."""
        await conn.fetch(
            "enqueue_limits_set",
            {
                "queue_name_max_chars": limits.queue_name_max_chars,
                "type_max_chars": limits.type_max_chars,
                "idempotency_key_max_chars": limits.idempotency_key_max_chars,
                "concurrency_key_max_chars": limits.concurrency_key_max_chars,
                "payload_max_bytes": limits.payload_max_bytes,
                "max_attempts_default": limits.max_attempts_default,
                "lease_seconds_default": limits.lease_seconds_default,
                "json_max_depth": limits.json_max_depth,
            },
        )
