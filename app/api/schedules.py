"""Periodic jobs: create or replace, list, read, delete, pause, resume and trigger schedules.

Admin keys change schedules; viewers (and admins) read them. A key scoped to some queues sees
and changes only the schedules whose jobs go to those queues. Every change is recorded in the
audit trail. How runs are timed and enqueued: app/domain/cron.py, app/queue/schedules.py.
"""

# No ``from __future__ import annotations`` here: the request models are built for the app's
# settings inside build_router, which FastAPI must see as classes.

from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Response, status

from app.api import schedule_models as wire
from app.api.auth import allow_queue, requires
from app.api.deps import Services
from app.api.render import job, json_response
from app.api.schedule_models import (
    SCHEDULE_NAME_DOC,
    Schedule,
    SchedulePage,
    request_spec,
    schedule_models,
    schedule_view,
)
from app.api.schemas import Job
from app.auth.keys import Permission, Principal
from app.domain.cron import SCHEDULE_NAME_PATTERN
from app.errors import PROBLEM
from app.http.strict_json import StrictJSONRoute
from app.settings import Settings

Observer = Annotated[Principal, requires(Permission.OBSERVE)]
Operator = Annotated[Principal, requires(Permission.OPERATE)]
Name = Annotated[str, Path(pattern=SCHEDULE_NAME_PATTERN.pattern, description=SCHEDULE_NAME_DOC)]

_CHANGE_ANSWERS: dict[int | str, dict[str, Any]] = {
    403: PROBLEM,
    404: PROBLEM,
    409: PROBLEM,
    422: PROBLEM,
}


def build_router(settings: Settings) -> APIRouter:
    """The schedule routes, validating against this app's limits (and documenting them)."""
    router = APIRouter(prefix="/v1/schedules", tags=["schedules"], route_class=StrictJSONRoute)
    # Built for this app's limits; mypy sees the default-limits class it extends.
    ScheduleRequest = schedule_models(settings).request

    @router.put(
        "/{name}",
        status_code=status.HTTP_201_CREATED,
        response_model=Schedule,
        responses={
            200: {"model": Schedule, "description": "An existing schedule was replaced"},
            **_CHANGE_ANSWERS,
        },
    )
    async def put_schedule(
        caller: Operator,
        name: Name,
        body: ScheduleRequest,  # type: ignore[valid-type]  # a class built above
        services: Services,
        response: Response,
    ) -> Schedule:
        """Creates the schedule (201) or replaces its definition (200).

        A replacement that keeps the timing (cron or interval, and zone) keeps the next run, so
        sending the same definition again changes nothing; a new timing starts from its first
        run after now. ``paused`` unset keeps the schedule's state. A schedule made by the
        JOBQ_SCHEDULES file is changed there (409 here).
        """
        definition: wire.ScheduleRequest = body
        allow_queue(caller, definition.template.queue, field="body.template.queue")
        spec = request_spec(definition)
        row, created = await services.schedules.put(
            name,
            spec,
            actor=caller.name,
            actor_key_id=caller.key_id,
            allowed=caller.covers if caller.scoped else None,
        )
        response.status_code = status.HTTP_201_CREATED if created else status.HTTP_200_OK
        return schedule_view(row)

    @router.get("", response_model=SchedulePage, responses={422: PROBLEM})
    async def list_schedules(
        caller: Observer,
        services: Services,
        limit: Annotated[int, Query(ge=1, le=settings.list_max_limit)] = 100,
        after: Annotated[
            str | None,
            Query(
                pattern=SCHEDULE_NAME_PATTERN.pattern,
                description="next_cursor of the previous page (a schedule name)",
            ),
        ] = None,
    ) -> SchedulePage:
        """Schedules in name order, with their next and last run and the last run's job.

        A key scoped to some queues sees the schedules of those queues only.
        """
        rows, next_cursor = await services.schedules.list_page(
            limit=limit, after=after, queue_patterns=caller.like_patterns()
        )
        return SchedulePage(schedules=[schedule_view(r) for r in rows], next_cursor=next_cursor)

    @router.get("/{name}", response_model=Schedule, responses={403: PROBLEM, 404: PROBLEM})
    async def get_schedule(caller: Observer, name: Name, services: Services) -> Schedule:
        """One schedule (403 when its queue is outside the key's scopes)."""
        row = await services.schedules.get(name)
        allow_queue(caller, row.queue, field="path.name")
        return schedule_view(row)

    @router.delete("/{name}", response_model=Schedule, responses=_CHANGE_ANSWERS)
    async def delete_schedule(caller: Operator, name: Name, services: Services) -> Schedule:
        """Deletes the schedule and answers it as it was; the jobs it enqueued stay."""
        row = await services.schedules.delete(
            name,
            actor=caller.name,
            actor_key_id=caller.key_id,
            allowed=caller.covers if caller.scoped else None,
        )
        return schedule_view(row)

    @router.post("/{name}/pause", response_model=Schedule, responses=_CHANGE_ANSWERS)
    async def pause_schedule(caller: Operator, name: Name, services: Services) -> Schedule:
        """Stops the schedule from enqueueing runs (jobs it enqueued already are not touched)."""
        row = await services.schedules.set_paused(
            name,
            paused=True,
            actor=caller.name,
            actor_key_id=caller.key_id,
            allowed=caller.covers if caller.scoped else None,
        )
        return schedule_view(row)

    @router.post("/{name}/resume", response_model=Schedule, responses=_CHANGE_ANSWERS)
    async def resume_schedule(caller: Operator, name: Name, services: Services) -> Schedule:
        """Lets the schedule run again from its first run after now: runs that came due while it
        was paused are not enqueued."""
        row = await services.schedules.set_paused(
            name,
            paused=False,
            actor=caller.name,
            actor_key_id=caller.key_id,
            allowed=caller.covers if caller.scoped else None,
        )
        return schedule_view(row)

    @router.post(
        "/{name}/trigger",
        status_code=status.HTTP_201_CREATED,
        response_model=Job,
        responses={403: PROBLEM, 404: PROBLEM, 422: PROBLEM},
    )
    async def trigger_schedule(caller: Operator, name: Name, services: Services) -> Response:
        """Enqueues one job from the schedule's template now, outside its timing, and answers it.

        The schedule does not move: its next run and last run stay (the trigger is one job
        more). A paused schedule can be triggered too, and the job is created even when its
        queue is paused (it waits there). The job names the schedule in its history; it is not
        a run, so it never stands in for one. Recorded in the audit trail (schedule.trigger).
        """
        row = await services.schedule_trigger.trigger(
            name,
            actor=caller.name,
            actor_key_id=caller.key_id,
            queue_patterns=caller.like_patterns(),
        )
        return json_response(job(row), status_code=status.HTTP_201_CREATED)

    return router
