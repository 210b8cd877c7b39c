"""Request dependencies, declared once as ``Annotated`` aliases."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from app.api.state import Runtime as AppRuntime
from app.api.state import app_state
from app.queue.service import JobService


async def get_runtime(request: Request) -> AppRuntime:
    """What the lifespan built (async: no threadpool hop per request)."""
    return app_state(request.app).running()


async def get_service(request: Request) -> JobService:
    """The app's job service."""
    return app_state(request.app).running().service


Service = Annotated[JobService, Depends(get_service)]
Runtime = Annotated[AppRuntime, Depends(get_runtime)]
