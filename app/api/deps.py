"""Request dependencies, declared once as ``Annotated`` aliases."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from app.queue.service import JobService


async def get_service(request: Request) -> JobService:
    """The app's job service, built by the lifespan (async: no threadpool hop per request)."""
    service: JobService = request.app.state.service
    return service


Service = Annotated[JobService, Depends(get_service)]
