"""The route class of the hot routes: FastAPI's contract and validation, without its per-call machinery.

Why, and what it measured: docs/adr/0008-lean-hot-routes.md. A :class:`LeanRoute`
keeps everything FastAPI derives from the endpoint's signature (the OpenAPI document, the
request model, the status codes) but answers requests with a handler built once per route:
the caller is settled first by the route's :class:`~app.http.strict_json.Gate` (before the body
is read); the body is parsed by :func:`parse_strict_json` and validated by the request model's
own pydantic-core validator; declared headers and query parameters are read and validated the same way; a dependency
that needs only the request (the service, say) is called with it. Errors are the same
``RequestValidationError`` FastAPI raises, with the same locations, so clients see no difference.
Nothing here knows the routes' service or keys: the routes hand both in through their
dependencies, so this package sits below app/api.

Endpoints whose parameters are anything else (path parameters, other dependencies) are served
by FastAPI's own handler.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.params import Depends, Header, Query
from pydantic import BaseModel, TypeAdapter, ValidationError

from app.http.strict_json import Gate, StrictJSONRoute, is_json, json_depth, parse_strict_json

Handler = Callable[[Request], Coroutine[Any, Any, Response]]


@dataclass(frozen=True)
class _Parameter:
    name: str
    kind: str  # "body", "dependency", "request", "header", "query" or "caller"
    adapter: TypeAdapter[Any] | None = None
    header: str | None = None  # the header's or query parameter's name
    default: Any = None
    call: Any = None  # the gate of a "caller", the function of a "dependency"


def _of_request_alone(dependency: Any) -> bool:
    """Whether a dependency is an async function of the request and nothing else."""
    if not inspect.iscoroutinefunction(dependency):
        return False
    parameters = list(inspect.signature(dependency).parameters)
    hints = typing.get_type_hints(dependency)
    return len(parameters) == 1 and hints.get(parameters[0]) is Request


def _plan(endpoint: Callable[..., Awaitable[Any]]) -> list[_Parameter] | None:
    """How to fill each parameter of the endpoint, or ``None`` when a lean handler cannot."""
    hints = typing.get_type_hints(endpoint, include_extras=True)
    plan: list[_Parameter] = []
    bodies = 0
    for name, parameter in inspect.signature(endpoint).parameters.items():
        hint: Any = hints.get(name)
        base: Any = hint
        extras: tuple[Any, ...] = ()
        if typing.get_origin(hint) is typing.Annotated:
            base, *rest = typing.get_args(hint)
            extras = tuple(rest)
        if base is Request:
            plan.append(_Parameter(name, "request"))
        elif dependencies := [e.dependency for e in extras if isinstance(e, Depends)]:
            if isinstance(dependencies[0], Gate):
                plan.append(_Parameter(name, "caller", call=dependencies[0]))
            elif _of_request_alone(dependencies[0]):
                plan.append(_Parameter(name, "dependency", call=dependencies[0]))
            else:
                return None
        elif headers := [e for e in extras if isinstance(e, Header)]:
            alias: str = headers[0].alias or name.replace("_", "-")
            default = None if parameter.default is inspect.Parameter.empty else parameter.default
            plan.append(_Parameter(name, "header", TypeAdapter(hint), alias, default))
        elif queries := [e for e in extras if isinstance(e, Query)]:
            alias = queries[0].alias or name
            default = None if parameter.default is inspect.Parameter.empty else parameter.default
            plan.append(_Parameter(name, "query", TypeAdapter(hint), alias, default))
        elif isinstance(base, type) and issubclass(base, BaseModel) and not extras:
            bodies += 1
            plan.append(_Parameter(name, "body", TypeAdapter(base)))
        else:
            return None
    return plan if bodies == 1 else None


def _errors(error: ValidationError, *loc: str) -> RequestValidationError:
    return RequestValidationError(
        [{**e, "loc": (*loc, *e["loc"])} for e in error.errors(include_url=False)]
    )


def lean_handler(route: StrictJSONRoute) -> Handler | None:
    """The lean handler of a route, or ``None`` when its endpoint takes other parameters."""
    plan = _plan(route.endpoint)
    if plan is None:
        return None
    # FastAPI's own handler (strict JSON) answers what the lean one does not deal with.
    fallback = StrictJSONRoute.get_route_handler(route)
    endpoint = route.endpoint
    # Who calls is settled before the body is even read: a caller without a valid key learns
    # nothing about what a valid request looks like.
    callers = [p for p in plan if p.kind == "caller"]

    async def handler(request: Request) -> Response:
        arguments: dict[str, Any] = {}
        for caller in callers:
            arguments[caller.name] = await caller.call.admit(request)
        if not is_json(request.headers.get("content-type")):
            return await fallback(request)  # FastAPI says what is wrong with the body
        raw = await request.body()
        if not raw:
            raise RequestValidationError(
                [{"type": "missing", "loc": ("body",), "msg": "Field required", "input": None}]
            )
        for parameter in plan:
            if parameter.kind == "body":
                data = parse_strict_json(raw, max_depth=json_depth(request.app))
                try:
                    arguments[parameter.name] = parameter.adapter.validate_python(data)  # type: ignore[union-attr]
                except ValidationError as error:
                    raise _errors(error, "body") from None
            elif parameter.kind == "dependency":
                arguments[parameter.name] = await parameter.call(request)
            elif parameter.kind == "request":
                arguments[parameter.name] = request
            elif parameter.kind == "caller":
                pass  # settled above
            elif parameter.kind == "query":
                value = request.query_params.get(parameter.header or "", parameter.default)
                try:
                    arguments[parameter.name] = parameter.adapter.validate_python(value)  # type: ignore[union-attr]
                except ValidationError as error:
                    raise _errors(error, "query", parameter.header or "") from None
            else:
                value = request.headers.get(parameter.header or "", parameter.default)
                try:
                    arguments[parameter.name] = parameter.adapter.validate_python(value)  # type: ignore[union-attr]
                except ValidationError as error:
                    raise _errors(error, "header", parameter.header or "") from None
        response: Response = await endpoint(**arguments)
        return response

    return handler


class LeanRoute(StrictJSONRoute):
    """A route whose endpoint takes one request model, headers, request-only dependencies and the request."""

    def get_route_handler(self) -> Handler:
        return lean_handler(self) or super().get_route_handler()
