"""Request dependencies, declared once as ``Annotated`` aliases."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from app.api.state import Runtime as AppRuntime
from app.api.state import app_state
from app.queue import services


async def get_runtime(request: Request) -> AppRuntime:
    """What the lifespan built (async: no threadpool hop per request)."""
    return app_state(request.app).running()


async def get_services(request: Request) -> services.Services:
    """The app's services (jobs, results, ops, limits, schedules, upkeep)."""
    return app_state(request.app).running().services


Services = Annotated[services.Services, Depends(get_services)]
Runtime = Annotated[AppRuntime, Depends(get_runtime)]
