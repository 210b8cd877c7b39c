"""The hot routes are answered by the lean handler; the others keep FastAPI's (no database)."""

from __future__ import annotations

from typing import Any

from fastapi import Request

from app.api import jobs, workers
from app.http.lean import LeanRoute, _of_request_alone, _plan
from app.settings import Settings

HOT = {
    ("POST", "/v1/jobs"),
    ("POST", "/v1/jobs/batch"),
    ("POST", "/v1/claim"),
    ("POST", "/v1/heartbeat"),
    ("POST", "/v1/complete"),
    ("POST", "/v1/fail"),
    ("POST", "/v1/release"),
}


def test_the_hot_routes_get_a_lean_handler_and_the_others_fastapis() -> None:
    settings = Settings(database_url="postgresql://unused/unused")
    routes = [*jobs.build_router(settings).routes, *workers.build_router(settings).routes]
    planned = {
        (method, route.path): _plan(route.endpoint) is not None
        for route in routes
        if isinstance(route, LeanRoute)
        for method in route.methods
    }
    assert {key for key, lean in planned.items() if lean} == HOT
    assert any(not lean for lean in planned.values())  # e.g. GET /v1/jobs/{job_id}


def test_the_fast_path_serves_exactly_the_hot_routes() -> None:
    from app.http.fastpath import _FastPath
    from app.main import create_app

    app = create_app(Settings(database_url="postgresql://unused/unused"))
    stack: Any = app.build_middleware_stack()
    for _ in range(len(app.outer)):  # the outer wrappers (timing, request ids) come first
        stack = stack.app
    assert isinstance(stack, _FastPath)
    assert set(stack.routes) == HOT


async def _of_request(request: Request) -> int:
    return 1


async def _of_more(request: Request, extra: int) -> int:
    return extra


def _not_async(request: Request) -> int:
    return 1


def test_only_an_async_dependency_of_the_request_alone_is_called_by_the_lean_handler() -> None:
    assert _of_request_alone(_of_request)
    assert not _of_request_alone(_of_more)
    assert not _of_request_alone(_not_async)
