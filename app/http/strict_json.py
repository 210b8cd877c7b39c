"""A route class whose JSON parser refuses what PostgreSQL's jsonb cannot store, as 422s naming the field.

Python's ``json`` accepts ``NaN``, ``Infinity``, numbers that overflow to infinity, ``\\u0000`` and
lone surrogates; jsonb and text columns reject all of them, which would surface as a 500 after
the request was accepted. Parsing strictly here turns each into a validation error up front.
An object that repeats a key is refused too: parsers disagree on which one counts (the first,
the last, an error), so a proxy, a log and this service could each read a different request.

Bodies are parsed once, by orjson (in C), then walked once for what it lets through (``\\u0000``,
nesting). orjson keeps the last of repeated keys without a word, so the walk also counts the
keys it sees; counts over the raw text (in C) that can never be lower than the text's keys show,
when equal, that nothing repeats. Only a body where they differ is parsed again, by a parser
that sees every key, to name the repeat. Two cases take Python's parser instead of orjson: a
body orjson refuses (to name the problem and where it is), and a body with a run of 19 or more
digits, since orjson reads integers past 64 bits as floats and would silently change them.

A request whose content type is given and is not JSON is a 415 when it has a body or its route
takes one; a body-less request to a route without a body passes whatever its header says.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Coroutine, Iterable
from typing import Any, Protocol, runtime_checkable

import orjson
from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute

from app.errors import UnsupportedMediaType
from app.settings import setting_default

# Depth is checked on the parsed value; this bounds the recursion of the parser itself first.
_MAX_DEPTH_DEFAULT: int = setting_default("max_json_depth")


_LONG_INTEGER = re.compile(rb"\d{19,}")

# The end of a key: a quote, whitespace, a colon. In a body a parser accepted, it matches at the
# closing quote of every key, once each (a match holds one quote, so none can swallow another's).
# Other matches start inside strings, at a quote that is escaped (``"a\": b"``) or opens one whose
# text begins with a colon (``":b"``); they only add to the count. ``\s`` is wider than JSON's
# whitespace, which also only adds.
_KEY_END = re.compile(rb'"\s*:')

_REPEATED_KEY = "duplicate key: a key may appear only once in an object"


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


# More digits than any integer a double can hold (about 1.8e308 has 309).
_INTEGER_DIGITS_MAX = 309


def _parse_int(text: str) -> int:
    """An integer, exact; refused past a double's range, as a float there is: JavaScript and Go
    workers read every JSON number as a double, and jsonb keeps no other trace of how it was
    written (jobq.enqueue() refuses the same: app/store/sql/schema/enqueue.sql)."""
    if len(text) - text.startswith("-") > _INTEGER_DIGITS_MAX:
        raise _Rejected(f"number {text[:40]}... is too large")
    value = int(text)
    try:
        float(value)
    except OverflowError:
        raise _Rejected(f"number {text[:40]} is too large") from None
    return value


def _string_problem(value: str) -> str | None:
    if "\x00" in value:
        return "text must not contain the NUL character (\\u0000)"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "text must not contain unpaired surrogates"
    return None


def _shape(value: Any, *, max_depth: int) -> int:
    """Raises ``_Rejected`` with the path of the first nesting past ``max_depth``; answers how
    many keys the objects in ``value`` hold. Scalars are not visited: for what orjson accepted
    from a body without ``\\u0000``, no string or number can be refused (see :func:`parse_strict_json`).

    The walk keeps no paths (a tuple per container was half its time on a batch of 500 jobs):
    only a body found too deep is walked again (:func:`_too_deep`) to name where.
    """
    if not isinstance(value, dict | list):
        return 0
    keys = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        current, depth = stack.pop()
        if isinstance(current, dict):
            keys += len(current)
            current = current.values()
        for item in current:
            if isinstance(item, dict | list):
                if depth >= max_depth:
                    message = f"nesting deeper than {max_depth} levels"
                    raise _Rejected(message, _too_deep(value, max_depth=max_depth))
                stack.append((item, depth + 1))
    return keys


def _too_deep(value: Any, *, max_depth: int) -> tuple[str | int, ...]:
    """The path of the first container of ``value`` nested past ``max_depth`` (``()``: none)."""
    stack: list[tuple[Any, tuple[str | int, ...], int]] = [(value, (), 1)]
    while stack:
        current, path, depth = stack.pop()
        if depth > max_depth:
            return path
        pairs = current.items() if isinstance(current, dict) else enumerate(current)
        for key, item in pairs:
            if isinstance(item, dict | list):
                stack.append((item, (*path, key), depth + 1))
    return ()


def check_json_value(value: Any, *, max_depth: int) -> int:
    """Raises ``_Rejected`` with the path of the first string, key or nesting PostgreSQL would refuse.

    Answers how many keys the objects in ``value`` hold, all together.
    """
    keys = 0
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
                keys += len(current)
                for key, item in current.items():
                    if (problem := _string_problem(key)) is not None:
                        raise _Rejected(f"key: {problem}", path)
                    stack.append((item, (*path, key), depth + 1))
            else:
                stack.extend((item, (*path, i), depth + 1) for i, item in enumerate(current))
    return keys


class _RepeatedKey(dict[str, Any]):
    """An object parsed from text in which a key came more than once (``key``, the first such)."""

    def __init__(self, pairs: list[tuple[str, Any]]) -> None:
        super().__init__(pairs)
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                break
            seen.add(key)
        self.key = key


def _repeated_key_path(body: bytes) -> tuple[str | int, ...] | None:
    """The path of a repeated key in ``body`` (valid JSON), if any: outer objects first, then in order."""
    repeated = False

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        nonlocal repeated
        obj = dict(items)
        if len(obj) == len(items):
            return obj
        repeated = True
        return _RepeatedKey(items)

    value = json.loads(body, object_pairs_hook=pairs)
    if not repeated:
        return None
    stack: list[tuple[Any, tuple[str | int, ...]]] = [(value, ())]
    while stack:
        current, path = stack.pop()
        if isinstance(current, _RepeatedKey):
            return (*path, current.key)
        if isinstance(current, dict):
            items: list[tuple[str | int, Any]] = list(current.items())
        elif isinstance(current, list):
            items = list(enumerate(current))
        else:
            continue
        stack.extend((item, (*path, k)) for k, item in reversed(items))
    return None


def _keys_unique(body: bytes, keys: int, *, utf8: bool) -> bool:
    """Whether no object of ``body`` (valid JSON) can repeat a key, given the keys its value holds.

    The parsed value holds one key per key in the text, less at least one for each repeat. Both
    counts below are the keys in the text plus something never negative (the colons inside
    strings; the quotes inside strings that ``_KEY_END`` also matches), so either one being equal
    to ``keys`` proves there is no repeat. Otherwise (a repeat, or such strings) the caller looks
    closer. The colon count holds in any encoding Python's parser reads (each colon has a 0x3A
    byte); the key-end count only in UTF-8, where every ASCII byte is the character it looks like.
    """
    if body.count(b":") == keys:
        return True
    return utf8 and len(_KEY_END.findall(body)) == keys


def parse_strict_json(body: bytes, *, max_depth: int = _MAX_DEPTH_DEFAULT) -> Any:
    """Parses a request body, raising ``RequestValidationError`` located at the offending field."""
    if not _LONG_INTEGER.search(body):
        try:
            value = orjson.loads(body)
        except orjson.JSONDecodeError:
            pass  # Python's parser below says what is wrong, and where
        else:
            # orjson refuses unpaired surrogates and numbers past a double, so of what jsonb
            # cannot store only NUL can have passed, and only written as the escape \u0000.
            check = check_json_value if b"\\u0000" in body else _shape
            try:
                keys = check(value, max_depth=max_depth)
            except _Rejected as exc:
                raise _validation_error(("body", *exc.path), exc.message) from None
            _refuse_repeated_keys(body, keys, utf8=True)
            return value
    try:
        value = json.loads(
            body, parse_constant=_reject_constant, parse_float=_parse_float, parse_int=_parse_int
        )
        keys = check_json_value(value, max_depth=max_depth)
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
    # Python's parser also reads UTF-16 and UTF-32 bodies.
    _refuse_repeated_keys(body, keys, utf8=json.detect_encoding(body).startswith("utf-8"))
    return value


def _refuse_repeated_keys(body: bytes, keys: int, *, utf8: bool) -> None:
    """Raises ``RequestValidationError`` at a repeated key of ``body``, valid JSON holding ``keys`` keys."""
    if _keys_unique(body, keys, utf8=utf8):
        return
    # Rare: parse again with a parser that shows each object's keys as written, to name the repeat.
    if (path := _repeated_key_path(body)) is not None:
        raise _validation_error(("body", *path), _REPEATED_KEY)


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


def json_depth(app: Any) -> int:
    """The deepest JSON nesting the app accepts (``create_app`` sets it from the settings)."""
    depth: int = getattr(app, "max_json_depth", _MAX_DEPTH_DEFAULT)
    return depth


@runtime_checkable
class Gate(Protocol):
    """A route dependency that settles who calls from the request alone, before the body is read."""

    async def admit(self, request: Request) -> Any:
        """The caller, or an exception when it may not call this route."""


def route_gate(dependencies: Iterable[Any]) -> Gate | None:
    """The gate among a route's dependencies (FastAPI ``Dependant`` list), if any."""
    for dependency in dependencies:
        if isinstance(dependency.call, Gate):
            return dependency.call
    return None


class StrictJSONRequest(Request):
    """A request whose ``json()`` is :func:`parse_strict_json`."""

    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            max_depth = json_depth(self.app)
            self._json = parse_strict_json(await self.body(), max_depth=max_depth)
        return self._json


def _unsupported_media_type(content_type: str) -> UnsupportedMediaType:
    """The 415 for a request body sent as ``content_type``."""
    media = content_type.split(";", 1)[0].strip()[:100]
    return UnsupportedMediaType(
        f"content type {media!r} is not accepted: send JSON, as application/json or "
        "application/*+json (or without a content type)",
        # RFC 9110, 12.5.1: Accept in a response names what a request to it may send.
        headers={"Accept": "application/json"},
    )


class StrictJSONRoute(APIRoute):
    """An ``APIRoute`` that hands its endpoint a :class:`StrictJSONRequest`, refusing non-JSON bodies."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        takes_body = self.body_field is not None
        # The route's own dependency checks the key again; it is a dictionary lookup.
        gate = route_gate(self.dependant.dependencies)

        async def strict_handler(request: Request) -> Response:
            if gate is not None:
                # Who calls is settled before the body is looked at: a caller without a valid
                # key learns nothing about what a valid request looks like.
                await gate.admit(request)
            strict = StrictJSONRequest(request.scope, request.receive)
            body = await strict.body()
            content_type = strict.headers.get("content-type")
            if not is_json(content_type):
                # A body-less request to a route without one is fine whatever its header says.
                if body or takes_body:
                    raise _unsupported_media_type(content_type or "")
            elif body:
                # Parse here, outside FastAPI's body reader, which would turn our 422 into a 400.
                await strict.json()
            return await handler(strict)

        return strict_handler
