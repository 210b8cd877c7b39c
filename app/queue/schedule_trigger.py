"""Running a schedule once, now, outside its timing: an operator's "trigger now".

The job is the one a run would enqueue (the schedule's template, with the defaults the runs'
jobs get), due at once, in the schedule's queue even when that queue is paused (it waits there,
as a run's job would). The schedule does not move: its next run, last run and last run's job
stay, so the cron keeps its rhythm and the trigger is one job more. A paused schedule can be
triggered too: pausing stops the scheduler, not an operator's explicit act.

**The job carries ``schedule_name``, not ``scheduled_for``.** The pair is a run's mark, held
unique by ``uq_jobs_schedule_run`` (migration 0015) and looked up by its instant
(``schedule_run_jobs``). With ``scheduled_for`` NULL the index treats every trigger as distinct
(PostgreSQL's NULLs are not equal), so a trigger neither takes a run's mark nor is refused by
one, and the scheduler's pass never mistakes it for a run, so ``last_run_at`` and
``last_job_id`` keep telling the cron's runs. The name stays because it is worth keeping: the
job's history says which schedule enqueued it (app/store/sql/job_events.sql), like a run's.

**One statement** (``schedule_trigger`` in sql/schedules.sql) reads the schedule, checks its
queue against the caller's scopes, inserts the job and its ``schedule.trigger`` audit row: they
commit together or not at all, at the database's ``now()``. The schedule's definition lives in
app/queue/schedules.py; services do not import each other, so this one reads the row itself.
"""

from __future__ import annotations

from collections.abc import Sequence

from app.domain.records import Job
from app.domain.types import JobDefaults, JobEvent
from app.errors import Forbidden, NotFound
from app.queue.events import Events
from app.store import Stores
from app.store.unit import UnitOfWork

# Who the audit trail names for a trigger made inside the process with no actor.
TRIGGER_ACTOR = "internal"


class ScheduleTriggerService:
    """Enqueues one job from a schedule's template now, audited, leaving the schedule as it is."""

    def __init__(
        self, *, unit: UnitOfWork, stores: Stores, events: Events, defaults: JobDefaults
    ) -> None:
        self.unit = unit
        self.stores = stores
        self.events = events
        # What the template's unset fields get: the same defaults as the scheduler's runs.
        self.defaults = defaults

    async def trigger(
        self,
        name: str,
        *,
        actor: str = TRIGGER_ACTOR,
        actor_key_id: int | None = None,
        queue_patterns: Sequence[str] | None = None,
    ) -> Job:
        """Enqueues one job from the schedule ``name`` now; answers the job.

        ``queue_patterns`` (SQL LIKE, ``Principal.like_patterns``) are the caller's scopes:
        a schedule whose queue matches none is refused (``Forbidden``) and nothing is written.
        ``NotFound`` when there is no such schedule.
        """
        async for attempt in self.unit.ops():
            async with attempt as conn:
                outcome = await self.stores.schedules.schedule_trigger(
                    conn,
                    name=name,
                    defaults=self.defaults,
                    actor=actor,
                    actor_key_id=actor_key_id,
                    queue_patterns=queue_patterns,
                )
        if outcome is None:
            raise NotFound(f"schedule {name!r} not found")
        job = outcome.job
        if job is None:
            raise Forbidden(
                f"schedule {name!r} enqueues into queue {outcome.queue!r}, outside this key's "
                "scopes",
                errors=[{"field": "path.name", "message": "queue outside the key's scopes"}],
            )
        self.events.publish(
            [JobEvent("enqueued", job.id, job.queue, status=job.status, type=job.type)]
        )
        self.events.wake(job.queue, 1)
        return job
