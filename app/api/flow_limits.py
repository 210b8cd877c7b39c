"""Concurrency and rate limits: list, set, delete (admin keys without queue scopes).

A limit is enforced by the claim statement itself, so it holds across every instance; see
app/queue/flow_limits.py for how patterns match and docs/guides/flow-control.md.
"""

# No ``from __future__ import annotations``: FastAPI reads the annotations at runtime.

import re
from datetime import datetime
from typing import Annotated, Literal

from fastapi import APIRouter, Path, Response, status
from pydantic import BaseModel, Field, model_validator

from app.api.auth import requires
from app.api.deps import Services
from app.api.schemas import StrictModel
from app.auth.keys import Permission, Principal
from app.domain.bounds import MAX_BIGINT
from app.domain.records import FlowLimit, FlowLimitUse
from app.errors import PROBLEM, Forbidden
from app.http.strict_json import StrictJSONRoute

Observer = Annotated[Principal, requires(Permission.OBSERVE)]
Operator = Annotated[Principal, requires(Permission.OPERATE)]

PATTERN_MAX_CHARS = 255
MAX_RUNNING_MAX = 1_000_000
RATE_LIMIT_MAX = 1_000_000
PER_SECONDS_MIN = 0.001
PER_SECONDS_MAX = 86_400.0
# Printable characters without spaces; "*" matches any run of characters.
_PATTERN = re.compile(r"^[!-~]+$")


class Rate(StrictModel):
    """A token bucket: at most ``limit`` claims per ``per_seconds``, a burst of up to ``limit``."""

    limit: int = Field(ge=1, le=RATE_LIMIT_MAX)
    per_seconds: float = Field(ge=PER_SECONDS_MIN, le=PER_SECONDS_MAX, allow_inf_nan=False)


class LimitRequest(StrictModel):
    """A limit on the jobs of every concurrency key (scope ``key``) or queue (scope ``queue``)
    matching ``pattern``, each on its own (a key in each queue on its own); give
    ``max_running``, ``rate`` or both."""

    scope: Literal["key", "queue"]
    pattern: str = Field(
        min_length=1,
        max_length=PATTERN_MAX_CHARS,
        description="A key or queue name; * matches any run of characters (customer:*).",
    )
    max_running: int | None = Field(
        default=None,
        ge=1,
        le=MAX_RUNNING_MAX,
        description="At most this many of each matching key's (or queue's) jobs run at once.",
    )
    rate: Rate | None = Field(
        default=None,
        description="At most rate.limit claims per rate.per_seconds for each matching key "
        "(or queue), as a token bucket refilled from the database's clock.",
    )

    @model_validator(mode="after")
    def _something(self) -> "LimitRequest":
        if not _PATTERN.match(self.pattern):
            raise ValueError("pattern: printable characters without spaces")
        if self.max_running is None and self.rate is None:
            raise ValueError("give max_running, rate or both")
        return self


class Limit(BaseModel):
    """A limit as set, with the jobs running under it now."""

    id: int
    scope: Literal["key", "queue"]
    pattern: str
    max_running: int | None
    rate: Rate | None
    running: int = Field(
        description="Jobs running now in the keys or queues it governs (each counted under the "
        "one limit that applies to it: the longest matching pattern)."
    )
    created_at: datetime
    updated_at: datetime


class LimitList(BaseModel):
    """Every limit, by scope and pattern."""

    limits: list[Limit]


def _limit(data: FlowLimit) -> Limit:
    rate = (
        Rate(limit=data.rate_limit, per_seconds=data.rate_per_seconds)
        if data.rate_limit is not None and data.rate_per_seconds is not None
        else None
    )
    return Limit(
        id=data.id,
        scope=data.scope,
        pattern=data.pattern,
        max_running=data.max_running,
        rate=rate,
        running=int(data.running or 0) if isinstance(data, FlowLimitUse) else 0,
        created_at=data.created_at,
        updated_at=data.updated_at,
    )


def _unscoped(caller: Principal) -> None:
    # A limit reaches across queues (a key's jobs may be anywhere): only unscoped keys set one.
    if caller.scoped:
        raise Forbidden(
            f"key {caller.name!r} is scoped to queues; limits need an unscoped admin key",
            errors=[{"field": "scope", "message": "limits need an unscoped admin key"}],
        )


def build_router() -> APIRouter:
    """The limit routes."""
    router = APIRouter(prefix="/v1/limits", tags=["limits"], route_class=StrictJSONRoute)

    @router.get("", response_model=LimitList)
    async def list_limits(caller: Observer, services: Services) -> LimitList:
        """Every concurrency and rate limit, with the jobs running under each now.

        A key scoped to some queues sees only the limits of those queues, named one by one
        (a key pattern or a queue glob may reach other teams' jobs).
        """
        rows = await services.limits.list_all()
        if caller.scoped:
            rows = [
                r
                for r in rows
                if r.scope == "queue" and "*" not in r.pattern and caller.covers(r.pattern)
            ]
        return LimitList(limits=[_limit(row) for row in rows])

    @router.put(
        "",
        response_model=Limit,
        status_code=status.HTTP_200_OK,
        responses={201: {"model": Limit, "description": "A new limit"}, 403: PROBLEM, 422: PROBLEM},
    )
    async def set_limit(
        caller: Operator, body: LimitRequest, services: Services, response: Response
    ) -> Limit:
        """Creates (201) or replaces (200) the limit of (scope, pattern). Claims made from now on
        apply it; jobs already running when a limit is first set are not counted against it."""
        _unscoped(caller)
        row = await services.limits.put(
            scope=body.scope,
            pattern=body.pattern,
            max_running=body.max_running,
            rate_limit=body.rate.limit if body.rate else None,
            rate_per_seconds=body.rate.per_seconds if body.rate else None,
            actor=caller.name,
            actor_key_id=caller.key_id,
        )
        if row.created:
            response.status_code = status.HTTP_201_CREATED
        return _limit(row)

    @router.delete(
        "/{limit_id}",
        response_model=Limit,
        responses={403: PROBLEM, 404: PROBLEM},
    )
    async def delete_limit(
        caller: Operator,
        limit_id: Annotated[int, Path(ge=1, le=MAX_BIGINT)],
        services: Services,
    ) -> Limit:
        """Deletes a limit; the jobs it held back may be claimed at once."""
        _unscoped(caller)
        row = await services.limits.delete(limit_id, actor=caller.name, actor_key_id=caller.key_id)
        return _limit(row)

    return router
