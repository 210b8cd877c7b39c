"""``Client``: the producer, query (awaiting results included) and raw worker-protocol calls of the jobq HTTP API over httpx."""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Mapping, Sequence
from datetime import datetime
from types import TracebackType
from typing import Any, Self
from urllib.parse import quote

import httpx

from jobq_client import tracing
from jobq_client.composing import (
    WORKFLOW_FINISHED,
    Callback,
    EnqueuedBatch,
    OnParentFailure,
    Step,
    drop_unset,
    job_ids,
    open_step_job,
)
from jobq_client.errors import JobqError, WaitTimeout, WorkflowWaitTimeout
from jobq_client.retry import Backoff, describe, is_dropped, is_transient

logger = logging.getLogger("jobq_client")

DEFAULT_BASE_URL = "http://127.0.0.1:8000"
DEFAULT_LIMITS = httpx.Limits(max_connections=100, max_keepalive_connections=20)  # httpx's
USER_AGENT = "jobq-client/0.1"
# The longest wait_seconds one GET /v1/jobs/{id} may ask for (the service's default limit,
# JOBQ_LONGPOLL_MAX_WAIT_SECONDS); a longer wait is several of them.
WAIT_SECONDS_MAX = 20.0
FINISHED = frozenset({"succeeded", "dead", "cancelled"})
# An unfinished job answered well before the wait asked for (an instance shutting down, or one
# of a release that ignores wait_seconds): pause before asking again, so the loop never spins.
EARLY_ANSWER_PAUSE_FIRST_SECONDS = 0.1
EARLY_ANSWER_PAUSE_MAX_SECONDS = 1.0
# Sends after the first of a request whose connection broke before any answer (only requests that
# are safe to repeat). One covers the keep-alive race; one more covers a second stale connection.
DROPPED_CONNECTION_RETRIES = 2


class LeaseResults(list[dict[str, Any]]):
    """The per-lease results of a complete, fail or release, in request order (a list, as these
    calls always answered), with what its ``claim_next`` claimed.

    ``claimed``: the jobs leased to the worker by the same call, as :meth:`Client.claim` answers
    them (``None`` when the call asked for none). ``claim_error``: the claim failed after the
    transition was done (the results stand); ``claimed`` then holds what it leased before.
    """

    def __init__(
        self,
        results: Sequence[dict[str, Any]],
        claimed: list[dict[str, Any]] | None = None,
        claim_error: JobqError | None = None,
    ) -> None:
        super().__init__(results)
        self.claimed = claimed
        self.claim_error = claim_error


def new_idempotency_key() -> str:
    """A key for one logical enqueue (or workflow create), so that sending it again can never
    create a second job (or workflow)."""
    return f"auto:{secrets.token_urlsafe(16)}"


def _jsonable_time(value: datetime | str) -> str:
    """An ISO 8601 string for a ``run_at``; a datetime without zone is refused (it is ambiguous)."""
    if isinstance(value, datetime):
        if value.tzinfo is None or value.utcoffset() is None:
            raise ValueError("run_at needs a timezone, e.g. datetime.now(UTC) + timedelta(...)")
        return value.isoformat()
    return value


def _problem_of(response: httpx.Response) -> dict[str, Any]:
    """The problem+json body of an error answer, or one made up from the status line and text."""
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict):
        return {"status": response.status_code, **body}
    return {
        "status": response.status_code,
        "title": response.reason_phrase or "Error",
        "detail": response.text[:1000],
    }


class Client:
    """An async client of the jobq API: enqueue, read, await results, cancel, retry, and the lease calls.

    Every error answer raises :class:`JobqError` with the service's problem details; transport
    failures raise httpx's own ``httpx.TransportError`` subclasses unchanged, once a request safe
    to repeat (reads, PUTs, enqueues, workflow creates, lease calls) was sent again after its
    connection broke before any answer.
    """

    def __init__(
        self,
        base_url: str = DEFAULT_BASE_URL,
        *,
        timeout: float = 30.0,
        transport: httpx.AsyncBaseTransport | None = None,
        api_key: str | None = None,
        limits: httpx.Limits | None = None,
    ) -> None:
        self.base_url = base_url
        self.timeout = timeout
        headers = {"user-agent": USER_AGENT}
        if api_key is not None:
            # Sent on every request; the service answers 401 without it once keys exist.
            headers["authorization"] = f"Bearer {api_key}"
        self._http = httpx.AsyncClient(
            base_url=base_url,
            timeout=timeout,
            transport=transport,
            headers=headers,
            # httpx's own pool unless told (a Worker sizes its pool: see worker.py).
            limits=limits if limits is not None else DEFAULT_LIMITS,
        )

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Closes the connection pool."""
        await self._http.aclose()

    async def _call(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Mapping[str, Any] | None = None,
        request_timeout: httpx.Timeout | None = None,
        repeatable: bool | None = None,
    ) -> Any:
        """Sends one request; answers the decoded JSON body or raises :class:`JobqError`.

        A request that is safe to send twice (``repeatable``; by default the reads and PUTs) is
        sent again when its connection broke before any answer came (:func:`is_dropped`).
        """
        if repeatable is None:
            repeatable = method in ("GET", "PUT")
        tries = 1 + (DROPPED_CONNECTION_RETRIES if repeatable else 0)
        headers: dict[str, str] = {}
        tracing.inject(headers)
        for attempt in range(1, tries + 1):
            try:
                response = await self._http.request(
                    method,
                    path,
                    json=json,
                    headers=headers or None,
                    params={k: v for k, v in (params or {}).items() if v is not None} or None,
                    timeout=(
                        request_timeout if request_timeout is not None else httpx.USE_CLIENT_DEFAULT
                    ),
                )
                break
            except httpx.TransportError as exc:
                if attempt == tries or not is_dropped(exc):
                    raise
                # Most often a pooled connection the server closed for idleness just as the
                # request went out; httpx has dropped it, so the next try takes a fresh one.
                logger.info(
                    "%s %s: connection dropped before an answer (%s); sending again",
                    method,
                    path,
                    describe(exc),
                )
        if response.status_code >= 400:
            raise JobqError(response.status_code, _problem_of(response))
        return response.json()

    # -- producers -------------------------------------------------------------------------

    async def enqueue(
        self,
        type: str,
        payload: Any = None,
        *,
        queue: str = "default",
        priority: int = 0,
        delay_seconds: float | None = None,
        run_at: datetime | str | None = None,
        max_attempts: int | None = None,
        lease_seconds: int | None = None,
        timeout_seconds: int | None = None,
        idempotency_key: str | None = None,
        concurrency_key: str | None = None,
        depends_on: Sequence[int] | None = None,
        on_parent_failure: OnParentFailure | None = None,
        ordering_key: str | None = None,
        callback_url: str | None = None,
    ) -> dict[str, Any]:
        """Enqueues one job; answers it (an idempotent replay answers the job it first created).

        ``concurrency_key`` groups jobs for the limits of :meth:`set_limit`; ``callback_url``
        receives the job's outcome, signed, when it finishes (verify it with
        :func:`jobq_client.verify_signature`). Without an
        ``idempotency_key`` the call makes one of its own, so that it can send the request
        again when the connection breaks before the answer without creating a second job.

        ``depends_on`` (job ids) makes the job wait (status ``waiting``, never claimed) until
        every one of those jobs has ended, then due; its handler reads them in
        ``ctx.parents`` / ``ctx.parent_results``. ``on_parent_failure`` (needs ``depends_on``)
        says what a parent ending dead or cancelled does: ``"cancel"`` this job too (the
        service's default) or ``"run"`` it anyway. An unknown parent raises :class:`JobqError`
        (422). ``ordering_key`` (not with ``depends_on``): the queue's jobs with that key run one
        at a time, in enqueue order.
        """
        if idempotency_key is None:
            idempotency_key = new_idempotency_key()
        body: dict[str, Any] = {
            "queue": queue,
            "type": type,
            "payload": payload,
            "priority": priority,
        }
        optional: dict[str, Any] = {
            "delay_seconds": delay_seconds,
            "run_at": None if run_at is None else _jsonable_time(run_at),
            "max_attempts": max_attempts,
            "lease_seconds": lease_seconds,
            "timeout_seconds": timeout_seconds,
            "idempotency_key": idempotency_key,
            "concurrency_key": concurrency_key,
            "depends_on": job_ids(depends_on),
            "on_parent_failure": on_parent_failure,
            "ordering_key": ordering_key,
            "callback_url": callback_url,
        }
        body.update(drop_unset(optional))
        job: dict[str, Any] = await self._call("POST", "/v1/jobs", json=body, repeatable=True)
        return job

    async def enqueue_batch(
        self,
        jobs: Sequence[Mapping[str, Any]],
        *,
        callback: Callback | Mapping[str, Any] | None = None,
    ) -> EnqueuedBatch:
        """Enqueues many jobs in one transaction (all or nothing); answers them in order.

        Each item takes the fields of :meth:`enqueue` (``type``, ``payload``, ``queue``, ...,
        ``depends_on``, ``on_parent_failure``, ``ordering_key``). A job without an
        ``idempotency_key`` gets one of its own, as in :meth:`enqueue`.

        ``callback`` (a :class:`Callback`, or a dict of enqueue fields plus ``when``) adds one
        job that waits for the whole batch: due once all of it succeeded (``when:
        "all_succeeded"``, the default; cancelled when one ends dead or cancelled) or ended at
        all (``"all_finished"``). Its handler finds the counts and the failed ids in
        ``ctx.parents``. The answer is a list of the batch's jobs, as it always was, whose
        ``callback`` attribute is the callback job (``None`` without one).
        """
        items = [self._batch_item(job) for job in jobs]
        body: dict[str, Any] = {"jobs": items}
        if callback is not None:
            body["callback"] = self._batch_item(
                callback.to_json() if isinstance(callback, Callback) else callback
            )
        answer = await self._call("POST", "/v1/jobs/batch", json=body, repeatable=True)
        return EnqueuedBatch(answer["jobs"], answer.get("callback"))

    async def enqueue_batch_ids(
        self,
        jobs: Sequence[Mapping[str, Any]],
        *,
        callback: Callback | Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """:meth:`enqueue_batch` answered leanly: ``{"ids", "created", "callback_id"}``.

        The jobs' ids in the order sent, whether this call created each (``False``: its
        idempotency key's job existed already), and the callback's id. The service renders no
        job for it, which makes large batches cheaper for both sides.
        """
        body: dict[str, Any] = {"jobs": [self._batch_item(job) for job in jobs]}
        if callback is not None:
            body["callback"] = self._batch_item(
                callback.to_json() if isinstance(callback, Callback) else callback
            )
        answer: dict[str, Any] = await self._call(
            "POST", "/v1/jobs/batch", params={"answer": "ids"}, json=body, repeatable=True
        )
        return answer

    @staticmethod
    def _batch_item(job: Mapping[str, Any]) -> dict[str, Any]:
        """One batch item as the wire takes it: ``run_at`` as text, ``depends_on`` as a list, a key."""
        item = dict(job)
        if isinstance(item.get("run_at"), datetime):
            item["run_at"] = _jsonable_time(item["run_at"])
        if item.get("depends_on") is not None:
            item["depends_on"] = job_ids(item["depends_on"])
        if item.get("idempotency_key") is None:
            item["idempotency_key"] = new_idempotency_key()
        return item

    async def get_job(self, job_id: int) -> dict[str, Any]:
        """One job by id (404 raises :class:`JobqError`)."""
        job: dict[str, Any] = await self._call("GET", f"/v1/jobs/{int(job_id)}")
        return job

    async def wait(
        self,
        job_id: int,
        *,
        # Not a cancellation deadline (asyncio.timeout would lose the last answer): it sets
        # each round's wait_seconds and when to raise WaitTimeout with the job as last seen.
        timeout: float,  # noqa: ASYNC109
        poll_seconds: float = WAIT_SECONDS_MAX,
    ) -> dict[str, Any]:
        """Waits until the job is finished (``succeeded``, ``dead`` or ``cancelled``); answers it.

        Long-polls ``GET /v1/jobs/{id}?wait_seconds=`` in rounds of at most ``poll_seconds``
        (20 s, the service's limit) until the job is finished or ``timeout`` seconds have
        passed; the service answers each round the moment the job finishes and holds no
        database connection meanwhile. A dead or cancelled job is answered like a succeeded
        one: look at ``status`` (and ``result``, ``last_error``).

        Raises :class:`WaitTimeout` (a ``TimeoutError``, carrying the unfinished job as last
        seen) when the time runs out: the job goes on; waiting again, or later, is fine.
        Raises :class:`JobqError` for an error answer that repeating will not mend (404 when
        the job does not exist or was deleted); transient failures (5xx, 429, no connection)
        are retried with a backoff within ``timeout``.
        """
        if not timeout >= 0:
            raise ValueError("timeout must be >= 0")
        if not 0 < poll_seconds <= WAIT_SECONDS_MAX:
            raise ValueError(f"poll_seconds must be in (0, {WAIT_SECONDS_MAX:g}]")
        deadline = time.monotonic() + timeout
        job: dict[str, Any] | None = None
        failures = Backoff()
        pause = EARLY_ANSWER_PAUSE_FIRST_SECONDS
        while True:
            rounded = round(max(0.0, min(deadline - time.monotonic(), poll_seconds)), 3)
            asked = time.monotonic()
            try:
                job = await self._wait_once(job_id, rounded)
            except (JobqError, httpx.TransportError, ValueError) as exc:
                if not is_transient(exc):
                    raise
                delay = failures.next()
                if time.monotonic() + delay >= deadline:
                    raise WaitTimeout(job_id, timeout, job) from exc
                await asyncio.sleep(delay)
                continue
            failures.reset()
            if job["status"] in FINISHED:
                return job
            now = time.monotonic()
            if now >= deadline:
                raise WaitTimeout(job_id, timeout, job)
            if now - asked < 0.9 * rounded:
                await asyncio.sleep(min(pause, deadline - now))
                pause = min(pause * 2, EARLY_ANSWER_PAUSE_MAX_SECONDS)
            else:
                pause = EARLY_ANSWER_PAUSE_FIRST_SECONDS

    async def _wait_once(self, job_id: int, wait_seconds: float) -> dict[str, Any]:
        """One long-polling read of the job."""
        # The answer may legitimately take the whole wait: read for that long plus the usual.
        timeout = httpx.Timeout(self.timeout, read=self.timeout + wait_seconds)
        job: dict[str, Any] = await self._call(
            "GET",
            f"/v1/jobs/{int(job_id)}",
            params={"wait_seconds": wait_seconds},
            request_timeout=timeout,
        )
        return job

    async def enqueue_and_wait(
        self,
        type: str,
        payload: Any = None,
        *,
        timeout: float,  # noqa: ASYNC109 - the wait's length, as in wait()
        queue: str = "default",
        priority: int = 0,
        delay_seconds: float | None = None,
        run_at: datetime | str | None = None,
        max_attempts: int | None = None,
        lease_seconds: int | None = None,
        timeout_seconds: int | None = None,
        idempotency_key: str | None = None,
        concurrency_key: str | None = None,
    ) -> dict[str, Any]:
        """Enqueues one job (as :meth:`enqueue`) and waits for it to finish (as :meth:`wait`).

        For short request / response work: ``timeout`` covers the wait, not the enqueue. On
        :class:`WaitTimeout` the job stays enqueued (its id is in the exception); with an
        ``idempotency_key``, calling again waits for the same job instead of adding one.
        """
        job = await self.enqueue(
            type,
            payload,
            queue=queue,
            priority=priority,
            delay_seconds=delay_seconds,
            run_at=run_at,
            max_attempts=max_attempts,
            lease_seconds=lease_seconds,
            timeout_seconds=timeout_seconds,
            idempotency_key=idempotency_key,
            concurrency_key=concurrency_key,
        )
        if job["status"] in FINISHED:  # an idempotent replay of a job that finished
            return job
        return await self.wait(job["id"], timeout=timeout)

    async def list_jobs(
        self,
        *,
        queue: str | None = None,
        status: str | None = None,
        type: str | None = None,
        limit: int = 50,
        after: str | None = None,
    ) -> dict[str, Any]:
        """One page of jobs, newest first: ``{"jobs": [...], "next_cursor": str | None}``."""
        params = {"queue": queue, "status": status, "type": type, "limit": limit, "after": after}
        page: dict[str, Any] = await self._call("GET", "/v1/jobs", params=params)
        return page

    async def cancel(self, job_id: int) -> dict[str, Any]:
        """Cancels a pending or running job; answers it (409 when its state does not allow it)."""
        job: dict[str, Any] = await self._call("POST", f"/v1/jobs/{int(job_id)}/cancel")
        return job

    async def retry(self, job_id: int) -> dict[str, Any]:
        """Moves a dead, cancelled or succeeded job back to pending; answers it."""
        job: dict[str, Any] = await self._call("POST", f"/v1/jobs/{int(job_id)}/retry")
        return job

    # -- workflows ---------------------------------------------------------------------------

    async def workflow(
        self,
        name: str,
        steps: Sequence[Step | Mapping[str, Any]],
        *,
        idempotency_key: str | None = None,
    ) -> dict[str, Any]:
        """Creates a workflow: every step's job in one transaction; answers the workflow.

        ``steps``: :class:`Step` values or dicts with the same keys (``name``, ``type``,
        ``after``: names of the steps it waits for, and any job field of :meth:`enqueue` but
        ``idempotency_key``, ``depends_on`` and ``ordering_key``; ``on_parent_failure`` only
        with ``after``). Steps without ``after`` are due at once; each other one waits until
        its parents end. A cycle, a duplicate or an unknown step name raises
        :class:`JobqError` (422, naming the step) and creates nothing.

        Without an ``idempotency_key`` the call makes one of its own, so that it can send the
        request again when the connection breaks before the answer without creating a second
        workflow. A key of the caller's own stands for the workflow it made: the same key with
        the same request answers that workflow again; with another request it raises
        :class:`JobqError` (422).

        The answer: ``{"id", "name", "created_at", "created_by", "state", "counts", "steps":
        [{"name", "after", "job"}]}``; ``state`` is ``running`` until every step ended, then
        ``succeeded``, ``failed`` (a step dead) or ``cancelled``.
        """
        body = {
            "name": name,
            "steps": [
                step.to_json(_jsonable_time) if isinstance(step, Step) else self._step_item(step)
                for step in steps
            ],
            "idempotency_key": idempotency_key or new_idempotency_key(),
        }
        workflow: dict[str, Any] = await self._call(
            "POST", "/v1/workflows", json=body, repeatable=True
        )
        return workflow

    @staticmethod
    def _step_item(step: Mapping[str, Any]) -> dict[str, Any]:
        item = dict(step)
        if isinstance(item.get("run_at"), datetime):
            item["run_at"] = _jsonable_time(item["run_at"])
        if item.get("after") is not None:
            item["after"] = list(item["after"])
        return item

    async def get_workflow(self, workflow_id: int) -> dict[str, Any]:
        """One workflow with each step's job as it is now (404 raises :class:`JobqError`)."""
        workflow: dict[str, Any] = await self._call("GET", f"/v1/workflows/{int(workflow_id)}")
        return workflow

    async def cancel_workflow(self, workflow_id: int) -> dict[str, Any]:
        """Cancels every open step (a running one's lease ends at once).

        Answers ``{"workflow_id", "changed": <steps moved>, "steps": {name: new state}}``.
        """
        change: dict[str, Any] = await self._call(
            "POST", f"/v1/workflows/{int(workflow_id)}/cancel"
        )
        return change

    async def retry_workflow(self, workflow_id: int) -> dict[str, Any]:
        """Puts every dead or cancelled step back (attempts reset): due when its parents all
        succeeded, waiting otherwise, so the graph resumes where it failed.

        Answers ``{"workflow_id", "changed": <steps moved>, "steps": {name: new state}}``.
        """
        change: dict[str, Any] = await self._call("POST", f"/v1/workflows/{int(workflow_id)}/retry")
        return change

    async def wait_workflow(
        self,
        workflow_id: int,
        *,
        timeout: float,  # noqa: ASYNC109 - the wait's length, as in wait()
        poll_seconds: float = WAIT_SECONDS_MAX,
    ) -> dict[str, Any]:
        """Waits until the workflow is no longer ``running``; answers it (look at ``state``).

        Reads the workflow, then long-polls (as :meth:`wait`, rounds of at most
        ``poll_seconds``) the job of its last open step, and reads the workflow again once that
        job finished, until every step ended or ``timeout`` seconds have passed; a chain is
        thus one long-poll, not a loop of reads. Raises :class:`WorkflowWaitTimeout` (a
        ``TimeoutError``, carrying the workflow as last seen) when the time runs out: the
        workflow goes on. Transient failures (5xx, 429, no connection) are retried with a
        backoff within ``timeout``; other error answers raise :class:`JobqError` (404: no such
        workflow).
        """
        if not timeout >= 0:
            raise ValueError("timeout must be >= 0")
        if not 0 < poll_seconds <= WAIT_SECONDS_MAX:
            raise ValueError(f"poll_seconds must be in (0, {WAIT_SECONDS_MAX:g}]")
        deadline = time.monotonic() + timeout
        workflow: dict[str, Any] | None = None
        failures = Backoff()
        while True:
            try:
                workflow = await self.get_workflow(workflow_id)
            except (JobqError, httpx.TransportError, ValueError) as exc:
                if not is_transient(exc):
                    raise
                delay = failures.next()
                if time.monotonic() + delay >= deadline:
                    raise WorkflowWaitTimeout(workflow_id, timeout, workflow) from exc
                await asyncio.sleep(delay)
                continue
            failures.reset()
            if workflow["state"] in WORKFLOW_FINISHED:
                return workflow
            open_job = open_step_job(workflow)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise WorkflowWaitTimeout(workflow_id, timeout, workflow)
            if open_job is None:  # every step ended between two reads: read again
                continue
            try:
                await self.wait(open_job, timeout=remaining, poll_seconds=poll_seconds)
            except WaitTimeout as exc:
                raise WorkflowWaitTimeout(workflow_id, timeout, workflow) from exc
            except JobqError as exc:
                if exc.status != 404:  # a step's job deleted: the workflow read tells
                    raise

    # -- periodic jobs (admin writes, viewers read) -------------------------------------------

    async def put_schedule(
        self,
        name: str,
        template: Mapping[str, Any],
        *,
        cron: str | None = None,
        interval_seconds: int | None = None,
        timezone: str = "UTC",
        catch_up: int | None = None,
        paused: bool | None = None,
    ) -> dict[str, Any]:
        """Creates or replaces the schedule ``name``; answers it with its ``next_run_at``.

        Give ``cron`` (5 fields, or 6 with seconds first) or ``interval_seconds``; ``template``
        is the job each run enqueues (``queue``, ``type``, ``payload``, ``priority``,
        ``max_attempts``, ``lease_seconds``, ``timeout_seconds``, ``concurrency_key``).
        ``catch_up``: how many missed runs to enqueue after downtime (server default when None).
        """
        body: dict[str, Any] = {"timezone": timezone, "template": dict(template)}
        optional = {
            "cron": cron,
            "interval_seconds": interval_seconds,
            "catch_up": catch_up,
            "paused": paused,
        }
        body.update({k: v for k, v in optional.items() if v is not None})
        schedule: dict[str, Any] = await self._call(
            "PUT", f"/v1/schedules/{quote(name, safe='')}", json=body
        )
        return schedule

    async def get_schedule(self, name: str) -> dict[str, Any]:
        """One schedule (404 raises :class:`JobqError`)."""
        schedule: dict[str, Any] = await self._call("GET", f"/v1/schedules/{quote(name, safe='')}")
        return schedule

    async def schedules(self, *, limit: int = 50, after: str | None = None) -> dict[str, Any]:
        """One page of schedules: ``{"schedules": [...], "next_cursor": str | None}``."""
        page: dict[str, Any] = await self._call(
            "GET", "/v1/schedules", params={"limit": limit, "after": after}
        )
        return page

    async def delete_schedule(self, name: str) -> dict[str, Any]:
        """Deletes a schedule (the jobs it enqueued stay); answers it as it was."""
        schedule: dict[str, Any] = await self._call(
            "DELETE", f"/v1/schedules/{quote(name, safe='')}"
        )
        return schedule

    async def pause_schedule(self, name: str) -> dict[str, Any]:
        """Stops a schedule from enqueueing runs; answers it."""
        schedule: dict[str, Any] = await self._call(
            "POST", f"/v1/schedules/{quote(name, safe='')}/pause"
        )
        return schedule

    async def resume_schedule(self, name: str) -> dict[str, Any]:
        """Lets a schedule run again from its first run after now; answers it."""
        schedule: dict[str, Any] = await self._call(
            "POST", f"/v1/schedules/{quote(name, safe='')}/resume"
        )
        return schedule

    async def trigger_schedule(self, name: str) -> dict[str, Any]:
        """Enqueues one job from the schedule's template now (its next run stays); answers the job.

        Not sent again on a dropped connection: a second trigger would be a second job.
        """
        job: dict[str, Any] = await self._call(
            "POST", f"/v1/schedules/{quote(name, safe='')}/trigger"
        )
        return job

    # -- concurrency and rate limits (admin) ------------------------------------------------

    async def set_limit(
        self,
        scope: str,
        pattern: str,
        *,
        max_running: int | None = None,
        rate: tuple[int, float] | None = None,
    ) -> dict[str, Any]:
        """Creates or replaces the limit of ``(scope, pattern)``; answers it.

        ``scope`` is ``"key"`` (jobs' ``concurrency_key``) or ``"queue"``; ``pattern`` a name or
        a glob (``customer:*``), each match limited on its own. ``max_running``: at most that
        many of its jobs at once; ``rate=(limit, per_seconds)``: at most ``limit`` claims per
        ``per_seconds``. Give one or both.
        """
        body: dict[str, Any] = {"scope": scope, "pattern": pattern}
        if max_running is not None:
            body["max_running"] = max_running
        if rate is not None:
            body["rate"] = {"limit": rate[0], "per_seconds": rate[1]}
        limit: dict[str, Any] = await self._call("PUT", "/v1/limits", json=body)
        return limit

    async def limits(self) -> list[dict[str, Any]]:
        """Every limit, with the jobs running under each now."""
        answer = await self._call("GET", "/v1/limits")
        listed: list[dict[str, Any]] = answer["limits"]
        return listed

    async def delete_limit(self, limit_id: int) -> dict[str, Any]:
        """Deletes a limit (404 raises :class:`JobqError`); answers it as it was."""
        limit: dict[str, Any] = await self._call("DELETE", f"/v1/limits/{int(limit_id)}")
        return limit

    # -- worker protocol -------------------------------------------------------------------

    async def claim(
        self,
        worker_id: str,
        queues: Sequence[str],
        *,
        max_jobs: int = 1,
        lease_seconds: int | None = None,
        wait_seconds: float = 0,
    ) -> list[dict[str, Any]]:
        """Leases up to ``max_jobs`` due jobs, long-polling up to ``wait_seconds`` when none is due."""
        body: dict[str, Any] = {
            "worker_id": worker_id,
            "queues": list(queues),
            "max_jobs": max_jobs,
            "wait_seconds": wait_seconds,
        }
        if lease_seconds is not None:
            body["lease_seconds"] = lease_seconds
        # The answer may legitimately take the whole wait: read for that long plus the usual.
        timeout = httpx.Timeout(self.timeout, read=self.timeout + max(0.0, wait_seconds))
        # Never sent again on a broken connection: the first claim may have leased jobs whose
        # answer was lost; those come back only when their leases expire.
        answer = await self._call("POST", "/v1/claim", json=body, request_timeout=timeout)
        jobs: list[dict[str, Any]] = answer["jobs"]
        return jobs

    async def _lease_call(
        self,
        operation: str,
        worker_id: str,
        leases: Sequence[Mapping[str, Any]],
        claim_next: Mapping[str, Any] | None = None,
    ) -> LeaseResults:
        body: dict[str, Any] = {"worker_id": worker_id, "leases": [dict(item) for item in leases]}
        timeout = None
        if claim_next is not None:
            body["claim_next"] = dict(claim_next)
            wait = float(claim_next.get("wait_seconds") or 0)
            # The claim may long-poll: read for that long plus the usual.
            timeout = httpx.Timeout(self.timeout, read=self.timeout + max(0.0, wait))
        # Safe to send twice: the same complete / fail / release with the same lease is answered
        # as a replay, and a second heartbeat only extends the lease again. Not with a claim
        # riding along: as a claim, that is never sent again.
        answer = await self._call(
            "POST",
            f"/v1/{operation}",
            json=body,
            request_timeout=timeout,
            repeatable=claim_next is None,
        )
        claimed = answer.get("claimed")
        problem = answer.get("claim_error")
        return LeaseResults(
            answer["results"],
            None if claimed is None else claimed["jobs"],
            None if problem is None else JobqError(int(problem.get("status") or 500), problem),
        )

    async def heartbeat(
        self, worker_id: str, leases: Sequence[Mapping[str, Any]]
    ) -> list[dict[str, Any]]:
        """Extends held leases, saving any ``checkpoint`` / ``progress``; answers one result per item.

        Items: ``job_id``, ``lease_id``, optional ``lease_seconds``, ``checkpoint``, ``progress``.
        A result ``{"ok": false, "error": "lease_lost"}`` (``"cancelled": true`` when the job was
        cancelled) means the caller must stop working on that job.
        """
        return await self._lease_call("heartbeat", worker_id, leases)

    async def complete(
        self,
        worker_id: str,
        leases: Sequence[Mapping[str, Any]],
        *,
        claim_next: Mapping[str, Any] | None = None,
    ) -> LeaseResults:
        """Completes held jobs (items: ``job_id``, ``lease_id``, optional ``result``); per item.

        ``claim_next``: then claim the worker's next jobs in the same request, with the fields
        of :meth:`claim` but the worker (``queues``, ``max_jobs``, ``lease_seconds``,
        ``wait_seconds``); they come back as the answer's ``claimed`` (see :class:`LeaseResults`).
        Such a request is not sent again on a broken connection, as a claim is not.
        """
        return await self._lease_call("complete", worker_id, leases, claim_next)

    async def fail(
        self,
        worker_id: str,
        leases: Sequence[Mapping[str, Any]],
        *,
        claim_next: Mapping[str, Any] | None = None,
    ) -> LeaseResults:
        """Fails the attempts of held jobs: retried after a backoff, or dead; answers per item.

        Items: ``job_id``, ``lease_id``, ``error``, ``retryable`` (default true), optional
        ``retry_after_seconds``. ``claim_next`` as for :meth:`complete`.
        """
        return await self._lease_call("fail", worker_id, leases, claim_next)

    async def release(
        self,
        worker_id: str,
        leases: Sequence[Mapping[str, Any]],
        *,
        claim_next: Mapping[str, Any] | None = None,
    ) -> LeaseResults:
        """Gives held jobs back to pending without charging the attempt; answers per item.

        Items: ``job_id``, ``lease_id``, optional ``checkpoint`` (replaces the saved one; left out,
        the saved one is kept) and ``delay_seconds``. ``claim_next`` as for :meth:`complete`.
        """
        return await self._lease_call("release", worker_id, leases, claim_next)
