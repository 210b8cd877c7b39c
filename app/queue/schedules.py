"""Periodic jobs: schedule definitions, and the pass that enqueues their due runs.

When a schedule runs is app/domain/cron.py (pure arithmetic); this service is where it meets
the database. Routes, the dashboard and the scheduler loop (app/maintenance/scheduler.py) reach
it through ``Services.schedules``.

**Exactly once per run.** The scheduler pass (:meth:`ScheduleService.enqueue_runs`) is one
transaction on the driver pool: it locks the due schedules (``FOR UPDATE SKIP LOCKED``, bounded
batch, due by the database's ``now()``), enqueues every run it plans with its own statement,
which marks each job with the run (``schedule_name``, ``scheduled_for``: columns no API field
reaches, so no producer can enqueue a job that stands in for a run or keeps one out; the runs'
jobs carry no idempotency key), and moves each schedule on with a conditional UPDATE (``WHERE
name = ... AND next_run_at = <value read>``). Jobs and schedule move together or not at all. Two
passes at once (two instances that both think they lead) lock different schedules; a pass that
ran on a stale read would find its runs marked already (the unique ``uq_jobs_schedule_run``
index answers, nothing is inserted twice) and its conditional UPDATE would move nothing, which
rolls the pass back.

**Errors.** A schedule whose runs cannot be computed (a time zone this instance does not know,
written by another release or host) is parked in the same pass: ``last_error`` and
``errored_at`` say why and since when, the due scan leaves it out, and it stays so until a
change (``PUT``) or a resume clears the error. It is shown by the API, the dashboard and the
``jobq_schedules_errored`` gauge.

**Definitions** are changed in one transaction each: the schedule's row is locked first
(``schedule_lock``, which also reads the transaction's clock), the next run is computed from
that clock, and the change and its audit row follow while the lock is held. A replacement that
keeps the timing keeps ``next_run_at``, so re-applying a definition (every start applies the
JOBQ_SCHEDULES file) never moves or skips a run. Pausing stops the scheduler from enqueueing
anything; resuming moves the schedule to its first run after the resume (the paused stretch is
not caught up). Schedules the file made (``source`` = ``file``) are changed through the file:
the API may pause and resume them but not replace or delete them (409).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from app.domain.cron import JobTemplate, RunPlan, ScheduleError, ScheduleSpec, Timing
from app.domain.records import Job, Schedule, ScheduleAt
from app.domain.states import JobStatus
from app.domain.types import JobDefaults, JobEvent, NewJob, ScheduleRun
from app.errors import Forbidden, InvalidInput, InvalidTransition, NotFound
from app.queue.events import Events
from app.store import Stores
from app.store.conn import Conn
from app.store.unit import UnitOfWork

SOURCE_API = "api"
SOURCE_FILE = "file"
# Who the audit trail names for a change made inside the process with no actor.
SCHEDULE_ACTOR = "internal"

# A route's check of the schedule's queue against the caller's scopes (None: every queue).
QueueCheck = Callable[[str], bool]


@dataclass(frozen=True)
class SkippedRuns:
    """Runs of one schedule a pass did not enqueue: more than ``catch_up`` had been missed."""

    name: str
    since: datetime  # the first skipped run (the schedule's next_run_at when the pass began)
    until: datetime  # the first run enqueued; every run in [since, until) was skipped
    catch_up: int


@dataclass(frozen=True)
class SchedulePass:
    """What one scheduler pass did."""

    schedules: int  # schedules moved to their next run
    enqueued: int  # jobs created (a run whose job existed already is not counted)
    skipped: tuple[SkippedRuns, ...] = ()
    # Schedules that could not be planned (name, reason); parked with the reason as last_error.
    failed: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class SyncOutcome:
    """What applying the schedules file changed, by schedule name."""

    created: tuple[str, ...]
    updated: tuple[str, ...]
    unchanged: tuple[str, ...]
    deleted: tuple[str, ...]


class ScheduleContended(Exception):
    """Internal: a schedule moved under a pass that held its lock; the pass is rolled back."""


def timing_of(row: Schedule) -> Timing:
    """The timing stored on a schedule's row."""
    return Timing(cron=row.cron, interval_seconds=row.interval_seconds, timezone=row.timezone)


def template_of(row: Schedule) -> JobTemplate:
    """The job template stored on a schedule's row."""
    return JobTemplate(
        queue=row.queue,
        type=row.type,
        payload=row.payload,
        priority=row.priority,
        max_attempts=row.max_attempts,
        lease_seconds=row.lease_seconds,
        timeout_seconds=row.timeout_seconds,
        concurrency_key=row.concurrency_key,
    )


def _state(paused: bool | None) -> str | None:
    if paused is None:
        return None
    return "paused" if paused else "active"


def _detail(name: str, row: Schedule) -> dict[str, Any]:
    """What the audit trail records of a schedule (not its payload, which may be large)."""
    timing = (
        {"cron": row.cron} if row.cron is not None else {"interval_seconds": row.interval_seconds}
    )
    return {
        "schedule": name,
        **timing,
        "timezone": row.timezone,
        "type": row.type,
        "catch_up": row.catch_up,
        "source": row.source,
    }


class ScheduleService:
    """Schedules: create or replace, read, list, pause, resume, delete, apply a file, and the
    scheduler's pass."""

    def __init__(
        self, *, unit: UnitOfWork, stores: Stores, events: Events, defaults: JobDefaults
    ) -> None:
        self.unit = unit
        self.stores = stores
        self.events = events
        # The runs' jobs get what an enqueue gives a job that leaves fields out.
        self.defaults = defaults

    # -- definitions -------------------------------------------------------------------------

    async def put(
        self,
        name: str,
        spec: ScheduleSpec,
        *,
        actor: str = SCHEDULE_ACTOR,
        actor_key_id: int | None = None,
        allowed: QueueCheck | None = None,
    ) -> tuple[Schedule, bool]:
        """Creates or replaces the schedule ``name``; answers it and whether it was created.

        ``allowed`` checks the queue of the schedule being replaced (``Forbidden`` if refused);
        a schedule of the JOBQ_SCHEDULES file is refused with ``InvalidTransition``.
        """

        async for attempt in self.unit.ops(transaction=True):
            async with attempt as conn:
                row, outcome = await self._schedule_write(
                    conn,
                    name,
                    spec,
                    source=SOURCE_API,
                    actor=actor,
                    actor_key_id=actor_key_id,
                    allowed=allowed,
                )
        return row, outcome == "created"

    async def _schedule_write(
        self,
        conn: Conn,
        name: str,
        spec: ScheduleSpec,
        *,
        source: str,
        actor: str,
        actor_key_id: int | None,
        allowed: QueueCheck | None = None,
        audit_unchanged: bool = True,
    ) -> tuple[Schedule, str]:
        """Writes one definition under the schedule's lock; answers the row and created /
        updated / unchanged."""
        prior = await self.stores.schedules.schedule_lock(conn, name=name)
        exists = prior.name is not None
        if exists:
            _check_queue(allowed, name, prior.queue)
            if source == SOURCE_API and prior.source == SOURCE_FILE:
                raise InvalidTransition(
                    f"schedule {name!r} comes from the JOBQ_SCHEDULES file: change it there "
                    "(pausing and resuming it work here)"
                )
        now: datetime = prior.db_now
        timing = spec.timing
        same_timing = exists and (prior.cron, prior.interval_seconds, prior.timezone) == (
            timing.cron,
            timing.interval_seconds,
            timing.timezone,
        )
        with _unusable_as_input():
            if not same_timing:
                next_run_at = timing.first_run(now)
            elif prior.paused and spec.paused is False:
                next_run_at = timing.resumed_run(prior.next_run_at, now)
            else:
                next_run_at = prior.next_run_at
        template = spec.template
        row = await self.stores.schedules.schedule_upsert(
            conn,
            values={
                "name": name,
                "cron": timing.cron,
                "interval_seconds": timing.interval_seconds,
                "timezone": timing.timezone,
                "queue": template.queue,
                "type": template.type,
                "payload": template.payload,
                "priority": template.priority,
                "max_attempts": template.max_attempts,
                "lease_seconds": template.lease_seconds,
                "timeout_seconds": template.timeout_seconds,
                "concurrency_key": template.concurrency_key,
                "catch_up": spec.catch_up,
                "paused": spec.paused,
                "next_run_at": next_run_at,
                "source": source,
            },
        )
        if row is None:
            if audit_unchanged:
                await self._schedule_audit(
                    conn,
                    name,
                    prior,
                    action="schedule.update",
                    outcome="unchanged",
                    actor=actor,
                    actor_key_id=actor_key_id,
                    before=prior.paused,
                    after=prior.paused,
                )
            return prior, "unchanged"
        created = bool(row.created)
        await self._schedule_audit(
            conn,
            name,
            row,
            action="schedule.create" if created else "schedule.update",
            outcome="changed",
            actor=actor,
            actor_key_id=actor_key_id,
            before=None if created else prior.paused,
            after=row.paused,
        )
        return row, "created" if created else "updated"

    async def _schedule_audit(
        self,
        conn: Conn,
        name: str,
        row: Schedule,
        *,
        action: str,
        outcome: str,
        actor: str,
        actor_key_id: int | None,
        before: bool | None,
        after: bool | None,
    ) -> None:
        await self.stores.audit.audit_insert(
            conn,
            actor=actor,
            actor_key_id=actor_key_id,
            action=action,
            outcome=outcome,
            queue=row.queue,
            state_before=_state(before),
            state_after=_state(after),
            detail=_detail(name, row),
        )

    async def get(self, name: str) -> Schedule:
        """One schedule; ``NotFound`` if there is none."""
        async for attempt in self.unit.ops():
            async with attempt as conn:
                row = await self.stores.schedules.schedule_get(conn, name=name)
        if row is None:
            raise NotFound(f"schedule {name!r} not found")
        return row

    async def list_page(
        self, *, limit: int, after: str | None = None, queue_patterns: Sequence[str] | None = None
    ) -> tuple[list[Schedule], str | None]:
        """A page of schedules in name order, and the next page's cursor (the last name; ``None``
        at the end); with ``queue_patterns`` (LIKE), only schedules of matching queues."""

        async for attempt in self.unit.ops():
            async with attempt as conn:
                rows = await self.stores.schedules.schedule_list(
                    conn, after=after, limit=limit + 1, queue_patterns=queue_patterns
                )
        next_cursor = rows[limit - 1].name if len(rows) > limit else None
        return rows[:limit], next_cursor

    async def delete(
        self,
        name: str,
        *,
        actor: str = SCHEDULE_ACTOR,
        actor_key_id: int | None = None,
        allowed: QueueCheck | None = None,
    ) -> Schedule:
        """Deletes a schedule (the jobs it enqueued stay); answers it as it was."""

        async for attempt in self.unit.ops(transaction=True):
            async with attempt as conn:
                answer = await self._delete_locked(
                    conn, name, actor=actor, actor_key_id=actor_key_id, allowed=allowed
                )
        return answer

    async def _delete_locked(
        self,
        conn: Conn,
        name: str,
        *,
        actor: str,
        actor_key_id: int | None,
        allowed: QueueCheck | None,
    ) -> Schedule:
        prior = await self.stores.schedules.schedule_lock(conn, name=name)
        if prior.name is None:
            raise NotFound(f"schedule {name!r} not found")
        _check_queue(allowed, name, prior.queue)
        if prior.source == SOURCE_FILE:
            raise InvalidTransition(
                f"schedule {name!r} comes from the JOBQ_SCHEDULES file: remove it there"
            )
        row = await self.stores.schedules.schedule_delete(conn, name=name)
        if row is None:  # locked above: cannot vanish
            raise NotFound(f"schedule {name!r} not found")
        await self._schedule_audit(
            conn,
            name,
            row,
            action="schedule.delete",
            outcome="changed",
            actor=actor,
            actor_key_id=actor_key_id,
            before=row.paused,
            after=None,
        )
        return row

    async def set_paused(
        self,
        name: str,
        *,
        paused: bool,
        actor: str = SCHEDULE_ACTOR,
        actor_key_id: int | None = None,
        allowed: QueueCheck | None = None,
    ) -> Schedule:
        """Pauses or resumes a schedule; a resume moves it to its first run after now.

        Pausing a paused schedule (or resuming an active one) changes nothing and is recorded
        as unchanged.
        """

        async for attempt in self.unit.ops(transaction=True):
            async with attempt as conn:
                answer = await self._set_paused_locked(
                    conn,
                    name,
                    paused=paused,
                    actor=actor,
                    actor_key_id=actor_key_id,
                    allowed=allowed,
                )
        return answer

    async def _set_paused_locked(
        self,
        conn: Conn,
        name: str,
        *,
        paused: bool,
        actor: str,
        actor_key_id: int | None,
        allowed: QueueCheck | None,
    ) -> Schedule:
        prior = await self.stores.schedules.schedule_lock(conn, name=name)
        if prior.name is None:
            raise NotFound(f"schedule {name!r} not found")
        _check_queue(allowed, name, prior.queue)
        with _unusable_as_input():
            next_run_at = (
                None if paused else timing_of(prior).resumed_run(prior.next_run_at, prior.db_now)
            )
        row = await self.stores.schedules.schedule_set_paused(
            conn, name=name, paused=paused, next_run_at=next_run_at
        )
        await self._schedule_audit(
            conn,
            name,
            row or prior,
            action="schedule.pause" if paused else "schedule.resume",
            outcome="changed" if row is not None else "unchanged",
            actor=actor,
            actor_key_id=actor_key_id,
            before=prior.paused,
            after=paused,
        )
        return row or prior

    async def sync(self, entries: Sequence[tuple[str, ScheduleSpec]], *, actor: str) -> SyncOutcome:
        """Applies a schedules file in one transaction: upserts each entry (``source`` file) and
        deletes the file's schedules it no longer names.

        An entry named like a schedule made through the API takes it over. Definitions that did
        not change are left alone (no audit row); every change is audited as ``actor``.
        """

        async for attempt in self.unit.ops(transaction=True):
            async with attempt as conn:
                answer = await self._sync_locked(conn, entries, actor=actor)
        return answer

    async def _sync_locked(
        self, conn: Conn, entries: Sequence[tuple[str, ScheduleSpec]], *, actor: str
    ) -> SyncOutcome:
        outcomes: dict[str, list[str]] = {"created": [], "updated": [], "unchanged": []}
        # In name order, as every instance applying the same file does: no deadlocks.
        for name, spec in sorted(entries, key=lambda entry: entry[0]):
            _, outcome = await self._schedule_write(
                conn,
                name,
                spec,
                source=SOURCE_FILE,
                actor=actor,
                actor_key_id=None,
                audit_unchanged=False,
            )
            outcomes[outcome].append(name)
        stale = await self.stores.schedules.schedule_delete_stale_file(
            conn, names=[name for name, _ in entries]
        )
        for row in stale:
            await self._schedule_audit(
                conn,
                row.name,
                row,
                action="schedule.delete",
                outcome="changed",
                actor=actor,
                actor_key_id=None,
                before=row.paused,
                after=None,
            )
        return SyncOutcome(
            created=tuple(outcomes["created"]),
            updated=tuple(outcomes["updated"]),
            unchanged=tuple(outcomes["unchanged"]),
            deleted=tuple(row.name for row in stale),
        )

    async def errored_counts(self) -> dict[str, int]:
        """Schedules in error (parked until changed or resumed), per queue."""
        async for attempt in self.unit.ops():
            async with attempt as conn:
                counts = await self.stores.schedules.schedule_errored_counts(conn)
        return counts

    # -- the scheduler's pass ------------------------------------------------------------------

    async def enqueue_runs(self, *, batch_size: int, now: datetime | None = None) -> SchedulePass:
        """Enqueues the due runs of at most ``batch_size`` schedules and moves them on, in one
        transaction; answers what it did.

        Due by ``now`` (default: the database's ``now()``). For each schedule the runs are its
        plan (app/domain/cron.py, ``Timing.plan``): the current run and up to ``catch_up``
        missed ones. After the commit the created jobs are announced like any enqueue (events
        for observers, wake-ups for the claims waiting on their queues).
        """

        async for attempt in self.unit.hot(transaction=True):
            async with attempt as conn:
                outcome, created = await self._schedule_pass(conn, batch_size=batch_size, now=now)
        self.events.publish(
            [JobEvent("enqueued", r.id, r.queue, status=r.status, type=r.type) for r in created]
        )
        self.events.wake_queues(r.queue for r in created if r.status == JobStatus.PENDING)
        return outcome

    async def _schedule_pass(
        self, conn: Conn, *, batch_size: int, now: datetime | None
    ) -> tuple[SchedulePass, list[Job]]:
        due = await self.stores.schedules.schedule_due(conn, batch_size=batch_size, now=now)
        planned: list[tuple[ScheduleAt, RunPlan]] = []
        failed: list[tuple[str, str]] = []
        park: list[dict[str, Any]] = []
        for row in due:
            try:
                plan = timing_of(row).plan(
                    next_run_at=row.next_run_at, now=row.db_now, catch_up=row.catch_up
                )
            except (ScheduleError, ValueError, OverflowError) as exc:
                failed.append((row.name, str(exc)))
                park.append({"name": row.name, "expected": row.next_run_at, "error": str(exc)})
                continue
            planned.append((row, plan))
        if park:
            # Planning it again would fail again, every pass: parked until somebody changes it.
            await self.stores.schedules.schedule_park(conn, items=park)
        if not planned:
            return SchedulePass(schedules=0, enqueued=0, failed=tuple(failed)), []

        runs: list[ScheduleRun] = []
        for row, plan in planned:
            template = template_of(row)
            runs.extend(
                ScheduleRun(
                    schedule_name=row.name,
                    scheduled_for=run,
                    job=self.defaults.apply(
                        NewJob(
                            queue=template.queue,
                            type=template.type,
                            payload=template.payload,
                            priority=template.priority,
                            run_at=run,
                            max_attempts=template.max_attempts,
                            lease_seconds=template.lease_seconds,
                            timeout_seconds=template.timeout_seconds,
                            concurrency_key=template.concurrency_key,
                        )
                    ),
                )
                for run in plan.runs
            )
        inserted = await self.stores.schedules.schedule_run_enqueue(conn, runs=runs) if runs else []
        job_ids = {
            (run.schedule_name, run.scheduled_for): job.id
            for run, job in zip(runs, inserted, strict=True)
            if job is not None
        }
        # The current run's job, where it existed already (enqueued before, by another pass).
        current = [(row.name, plan.runs[-1]) for row, plan in planned if plan.runs]
        missing = [run for run in current if run not in job_ids]
        if missing:
            found = await self.stores.schedules.schedule_run_jobs(conn, runs=missing)
            job_ids.update({run: job.id for run, job in found.items()})

        advance = []
        skipped = []
        for row, plan in planned:
            last = plan.runs[-1] if plan.runs else None
            advance.append(
                {
                    "name": row.name,
                    "expected": row.next_run_at,
                    "next_run_at": plan.next_run_at,
                    "last_run_at": last,
                    "last_job_id": job_ids.get((row.name, last)) if last is not None else None,
                }
            )
            if plan.skipped_from is not None and plan.runs:
                skipped.append(
                    SkippedRuns(
                        name=row.name,
                        since=plan.skipped_from,
                        until=plan.runs[0],
                        catch_up=row.catch_up,
                    )
                )
        moved = await self.stores.schedules.schedule_advance(conn, items=advance)
        if moved != {row.name for row, _ in planned}:
            raise ScheduleContended(
                "schedules moved under a pass that held them: "
                + ", ".join(sorted({row.name for row, _ in planned} - moved))
            )
        created = [job for job in inserted if job is not None]
        outcome = SchedulePass(
            schedules=len(planned),
            enqueued=len(created),
            skipped=tuple(skipped),
            failed=tuple(failed),
        )
        return outcome, created


@contextlib.contextmanager
def _unusable_as_input() -> Iterator[None]:
    """A timing that yields no next run (checked when it was made; never seen) is a 422."""
    try:
        yield
    except ScheduleError as exc:
        raise InvalidInput(
            f"invalid schedule: {exc.field}: {exc.message}",
            errors=[{"field": f"body.{exc.field}", "message": exc.message}],
        ) from None


def _check_queue(allowed: QueueCheck | None, name: str, queue: str) -> None:
    if allowed is not None and not allowed(queue):
        raise Forbidden(
            f"schedule {name!r} enqueues into queue {queue!r}, outside this key's scopes",
            errors=[{"field": "path.name", "message": "queue outside the key's scopes"}],
        )
