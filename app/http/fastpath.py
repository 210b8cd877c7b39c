"""The hot routes answered at the top of the app, before Starlette's middleware stack and router.

Profiled under 16 concurrent enqueues, a quarter of the server's CPU went to the layers between
the app's entry and the route's handler: the error and exception middlewares, the exit-stack
middleware, the router's matching and the request wrapper. :class:`JobqAPI` keeps FastAPI for
everything (the OpenAPI document, every other route, the exception handlers) but puts a fast
path first in its middleware stack: a request for one of the hot routes (the ones a
:class:`~app.http.lean.LeanRoute` serves with its lean handler) goes straight to that same
handler, through the same body limit, and any exception it raises is answered by the app's own
handler for it. A request for anything else takes the ordinary way.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from fastapi import FastAPI, Request, Response
from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp, Receive, Scope, Send

from app.http.body_limit import BodyLimit
from app.http.contract import document_problems
from app.http.lean import LeanRoute, lean_handler
from app.http.strict_json import is_json
from app.settings import setting_default

Handler = Callable[[Request], Coroutine[Any, Any, Response]]


class _FastPath:
    """ASGI app: the hot routes by (method, path), everything else to ``inner``."""

    def __init__(self, api: FastAPI, inner: ASGIApp, *, max_body_size: int) -> None:
        self.api = api
        self.inner = inner
        self.routes: dict[tuple[str, str], Handler] = {}
        for route in api.router.routes:
            if isinstance(route, LeanRoute) and (handler := lean_handler(route)) is not None:
                for method in route.methods or ():
                    self.routes[(method, route.path)] = handler
        self.limited = BodyLimit(self._serve, max_body_size=max_body_size)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] == "http"
            and (scope["method"], scope["path"]) in self.routes
            and is_json(_content_type(scope))
        ):
            await self.limited(scope, receive, send)
            return
        # Anything else, a body that is not JSON included, is FastAPI's to answer.
        await self.inner(scope, receive, send)

    async def _serve(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        handler = self.routes[(scope["method"], scope["path"])]
        try:
            response = await handler(request)
        except Exception as exc:  # noqa: BLE001 - answered by the app's handler for its type
            response = await self._answer(request, exc)
        await response(scope, receive, send)

    async def _answer(self, request: Request, exc: Exception) -> Response:
        handlers = self.api.exception_handlers
        for kind in type(exc).__mro__:
            if kind in handlers:
                answer: Any = handlers[kind](request, exc)
                response: Response = await answer
                return response
        raise exc  # the app registers a handler for Exception; never reached


def _content_type(scope: Scope) -> str | None:
    for name, value in scope["headers"]:
        if name == b"content-type":
            return str(value.decode("latin-1"))
    return None


class JobqAPI(FastAPI):
    """FastAPI with the fast path for the hot routes first in its middleware stack."""

    body_limit_bytes: int = 1024 * 1024
    # Deepest JSON nesting a body may have; read by the strict JSON routes (app/http/strict_json.py).
    max_json_depth: int = setting_default("max_json_depth")
    # Origins CORS allows; empty: no CORS headers at all (browsers keep other origins out).
    cors_origins: Sequence[str] = ()
    # Wrappers around everything, fast path included (request ids, timings): the first listed
    # is the outermost.
    outer: Sequence[Callable[[ASGIApp], ASGIApp]] = ()

    def openapi(self) -> dict[str, Any]:
        """FastAPI's document, with the problem answers given around the routes."""
        if self.openapi_schema is None:
            self.openapi_schema = document_problems(super().openapi())
        return self.openapi_schema

    def build_middleware_stack(self) -> ASGIApp:
        """Starlette's stack, behind the fast path; CORS, when origins are set, in front of both."""
        app: ASGIApp = _FastPath(
            self, super().build_middleware_stack(), max_body_size=self.body_limit_bytes
        )
        if self.cors_origins:
            # Keys travel in the Authorization header, never in cookies: no credentials mode,
            # so even a listed "*" cannot let a page send a user's cookies along.
            app = CORSMiddleware(
                app,
                allow_origins=list(self.cors_origins),
                allow_methods=["GET", "POST"],
                allow_headers=["Authorization", "Content-Type", "Idempotency-Key"],
                allow_credentials=False,
                max_age=600,
            )
        for wrap in reversed(self.outer):
            app = wrap(app)
        return app
