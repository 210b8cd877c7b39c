"""A route class whose JSON parser refuses what PostgreSQL's jsonb cannot store, as 422s naming the field.

Python's ``json`` accepts ``NaN``, ``Infinity``, numbers that overflow to infinity, ``\\u0000`` and
lone surrogates; jsonb and text columns reject all of them, which would surface as a 500 after
the request was accepted. Parsing strictly here turns each into a validation error up front.

Bodies are parsed once, by orjson (in C), then walked once for what it lets through (``\\u0000``,
nesting). Two cases take Python's parser instead: a body orjson refuses (to name the problem
and where it is), and a body with a run of 19 or more digits, since orjson reads integers past
64 bits as floats and would silently change them.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Coroutine
from typing import Any

import orjson
from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute

from app.api.state import app_state
from app.settings import setting_default

# Depth is checked on the parsed value; this bounds the recursion of the parser itself first.
_MAX_DEPTH_DEFAULT: int = setting_default("max_json_depth")


_LONG_INTEGER = re.compile(rb"\d{19,}")


class _Rejected(ValueError):
    def __init__(self, message: str, path: tuple[str | int, ...] = ()) -> None:
        super().__init__(message)
        self.message = message
        self.path = path


def _reject_constant(name: str) -> Any:
    raise _Rejected(f"{name} is not valid JSON")


def _parse_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise _Rejected(f"number {text[:40]} is too large")
    return value


def _string_problem(value: str) -> str | None:
    if "\x00" in value:
        return "text must not contain the NUL character (\\u0000)"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "text must not contain unpaired surrogates"
    return None


def check_json_value(value: Any, *, max_depth: int) -> None:
    """Raises ``_Rejected`` with the path of the first string, key or nesting PostgreSQL would refuse."""
    stack: list[tuple[Any, tuple[str | int, ...], int]] = [(value, (), 1)]
    while stack:
        current, path, depth = stack.pop()
        if isinstance(current, str):
            if (problem := _string_problem(current)) is not None:
                raise _Rejected(problem, path)
        elif isinstance(current, float) and not math.isfinite(current):
            raise _Rejected("number is too large", path)
        elif isinstance(current, dict | list):
            if depth > max_depth:
                raise _Rejected(f"nesting deeper than {max_depth} levels", path)
            if isinstance(current, dict):
                for key, item in current.items():
                    if (problem := _string_problem(key)) is not None:
                        raise _Rejected(f"key: {problem}", path)
                    stack.append((item, (*path, key), depth + 1))
            else:
                stack.extend((item, (*path, i), depth + 1) for i, item in enumerate(current))


def parse_strict_json(body: bytes, *, max_depth: int = _MAX_DEPTH_DEFAULT) -> Any:
    """Parses a request body, raising ``RequestValidationError`` located at the offending field."""
    if not _LONG_INTEGER.search(body):
        try:
            value = orjson.loads(body)
        except orjson.JSONDecodeError:
            pass  # Python's parser below says what is wrong, and where
        else:
            try:
                check_json_value(value, max_depth=max_depth)
            except _Rejected as exc:
                raise _validation_error(("body", *exc.path), exc.message) from None
            return value
    try:
        value = json.loads(body, parse_constant=_reject_constant, parse_float=_parse_float)
        check_json_value(value, max_depth=max_depth)
    except _Rejected as exc:
        raise _validation_error(("body", *exc.path), exc.message) from None
    except json.JSONDecodeError as exc:
        raise _validation_error(
            ("body",), f"invalid JSON: {exc.msg} at position {exc.pos}"
        ) from None
    except UnicodeDecodeError:
        raise _validation_error(("body",), "the body is not UTF-8") from None
    except RecursionError:
        raise _validation_error(("body",), "JSON nested too deeply") from None
    except ValueError as exc:  # e.g. integers past Python's digit limit
        raise _validation_error(("body",), f"invalid JSON: {exc}") from None
    return value


def _validation_error(loc: tuple[str | int, ...], message: str) -> RequestValidationError:
    return RequestValidationError(
        [{"type": "json_invalid", "loc": loc, "msg": message, "input": None}]
    )


def is_json(content_type: str | None) -> bool:
    """Whether a request's content type is JSON (or absent, which clients often leave it)."""
    if not content_type:
        return True
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (
        media.startswith("application/") and media.endswith("+json")
    )


class StrictJSONRequest(Request):
    """A request whose ``json()`` is :func:`parse_strict_json`."""

    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            max_depth = app_state(self.app).settings.max_json_depth
            self._json = parse_strict_json(await self.body(), max_depth=max_depth)
        return self._json


class StrictJSONRoute(APIRoute):
    """An ``APIRoute`` that hands its endpoint a :class:`StrictJSONRequest`."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def strict_handler(request: Request) -> Response:
            strict = StrictJSONRequest(request.scope, request.receive)
            # Parse here, outside FastAPI's body reader, which would turn our 422 into a bare 400.
            if await strict.body() and is_json(strict.headers.get("content-type")):
                await strict.json()
            return await handler(strict)

        return strict_handler
