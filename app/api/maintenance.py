"""The jobs the maintenance loops set aside: read them, and put one back.

A reaper, promoter or pruner batch that fails in a way a retry would repeat is done again one
job at a time; a job that fails even alone is set aside with its error (app/queue/upkeep.py),
so the loop goes on with every other job. These routes show those jobs and let an operator put
one back into its loop's batches once its cause is fixed (audited as ``maintenance.put_back``).
"""

# No ``from __future__ import annotations``: FastAPI reads the annotations at runtime.

from datetime import datetime
from typing import Annotated, Literal

from fastapi import APIRouter, Path, Query
from pydantic import BaseModel, Field

from app.api.auth import allow_queue, requires
from app.api.deps import Services
from app.auth.keys import Permission, Principal
from app.domain.bounds import MAX_BIGINT
from app.domain.maintenance_records import SetAside as SetAsideRow
from app.errors import PROBLEM, NotFound
from app.http.strict_json import StrictJSONRoute

Observer = Annotated[Principal, requires(Permission.OBSERVE)]
Operator = Annotated[Principal, requires(Permission.OPERATE)]
Loop = Literal["reaper", "promoter", "pruner"]

SET_ASIDE_PAGE_MAX = 500


class SetAside(BaseModel):
    """A job a maintenance loop could not move even alone, left out of its batches."""

    loop: Loop = Field(description="The loop that set it aside.")
    job_id: int
    queue: str | None
    error: str = Field(description="What PostgreSQL answered when the job was tried alone.")
    sqlstate: str | None
    failures: int = Field(description="Times it was tried alone and failed.")
    first_failed_at: datetime
    last_failed_at: datetime
    job_status: str | None = Field(description="The job's state now (null: it was deleted).")


class SetAsideList(BaseModel):
    """The jobs set aside, newest failure first."""

    jobs: list[SetAside]


def _wire(row: SetAsideRow) -> SetAside:
    return SetAside(
        loop=row.loop,
        job_id=row.job_id,
        queue=row.queue,
        error=row.error,
        sqlstate=row.sqlstate,
        failures=row.failures,
        first_failed_at=row.first_failed_at,
        last_failed_at=row.last_failed_at,
        job_status=row.status,
    )


def build_router() -> APIRouter:
    """The set-aside routes."""
    router = APIRouter(prefix="/v1/maintenance", tags=["maintenance"], route_class=StrictJSONRoute)

    @router.get("/set-aside", response_model=SetAsideList)
    async def set_aside(
        caller: Observer,
        services: Services,
        limit: Annotated[int, Query(ge=1, le=SET_ASIDE_PAGE_MAX)] = 100,
    ) -> SetAsideList:
        """The jobs a maintenance loop (reaper, promoter, pruner) could not move even alone:
        each failed a batch, then failed again on its own, and is left out of that loop's
        batches (with PostgreSQL's error) so that every other job keeps moving. Normally empty;
        ``jobq_maintenance_set_aside`` on /metrics counts them. A scoped key sees its queues'."""
        rows = await services.upkeep.set_aside(limit=limit, queue_patterns=caller.like_patterns())
        return SetAsideList(jobs=[_wire(r) for r in rows])

    @router.delete(
        "/set-aside/{loop}/{job_id}",
        response_model=SetAside,
        responses={403: PROBLEM, 404: PROBLEM},
    )
    async def put_back(
        caller: Operator,
        services: Services,
        loop: Loop,
        job_id: Annotated[int, Path(ge=1, le=MAX_BIGINT)],
    ) -> SetAside:
        """Puts a set-aside job back into its loop's next batches (once its cause is fixed, e.g.
        a trigger of yours that refused it); answers the row it removed. Audited
        (``maintenance.put_back``). 404 when that loop had not set the job aside."""
        if caller.scoped:
            allow_queue(caller, (await services.jobs.get(job_id)).queue, field="path.job_id")
        removed = await services.upkeep.put_back(
            loop=loop, job_id=job_id, actor=caller.name, actor_key_id=caller.key_id
        )
        if removed is None:
            raise NotFound(f"job {job_id} is not set aside by the {loop}")
        return _wire(removed)

    return router
