"""Stored JSON read back one value at a time: what no JSON reader can take becomes a marker.

The API refuses what it could not read back (app/http/strict_json.py), and ``jobq.enqueue()``
checks the same (migration 0025); but a row may still hold such a value: written by an older
version, by hand, or by a path that skipped the checks. A number like ``1e5000`` (jsonb keeps it
as 5,001 digits) or nesting past the parsers' limits made every read of that row fail, and with
it the claim or listing that read it. Both the driver's and the engine's jsonb decoders use
:func:`read_json`, so such a value arrives as :class:`UnreadableJson`; the rest of the row, and
every other row, reads as usual. The API shows the value as ``null`` and says why in
``stored_json_errors``; a claim fails the job at once (app/queue/jobs.py).
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

import orjson

# A run of 19 or more digits: orjson reads an integer past 64 bits as a float, and jsonb keeps
# such integers exactly (the request parser lets them in as they are): Python's parser reads them.
_LONG_INTEGER = re.compile(r"\d{19,}")


class UnreadableJson:
    """A stored JSON value no reader could take back, and why."""

    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def __repr__(self) -> str:
        return f"UnreadableJson({self.reason!r})"

    def __str__(self) -> str:
        return f"<stored JSON no reader can take: {self.reason}>"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, UnreadableJson) and other.reason == self.reason

    def __hash__(self) -> int:
        return hash(self.reason)


def _finite(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise ValueError(f"the number {text[:20]}... is beyond a double's range")
    return value


def read_json(text: bytes | str) -> Any:
    """The Python value of stored JSON text, or :class:`UnreadableJson` saying why not."""
    raw = text.decode() if isinstance(text, bytes) else text
    if _LONG_INTEGER.search(raw) is None:
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError:
            pass  # Python's parser says what it is, or reads it after all
    try:
        return json.loads(raw, parse_float=_finite)  # exact for any integer
    except RecursionError:
        return UnreadableJson("nested too deep to read")
    except ValueError as exc:  # json.JSONDecodeError, and int() past sys.get_int_max_str_digits()
        message = str(exc)
        if "digits" in message or "range" in message:
            return UnreadableJson("a number beyond a double's range")
        return UnreadableJson(f"not readable as JSON: {message[:120]}")


# The JSON columns of a job, as its record's attributes.
JOB_JSON_FIELDS = ("payload", "result", "checkpoint", "progress", "errors")


def job_json_errors(row: Any) -> dict[str, str] | None:
    """Of a job record's JSON fields, those that could not be read, with why (mostly ``None``)."""
    found: dict[str, str] | None = None
    for name in JOB_JSON_FIELDS:
        value = getattr(row, name, None)
        if type(value) is UnreadableJson:
            found = found or {}
            found[name] = value.reason
    return found


def claim_json_errors(row: Any) -> dict[str, str] | None:
    """Of what a claim hands a worker (payload, checkpoint), what could not be read, with why."""
    payload, checkpoint = row.payload, row.checkpoint
    if type(payload) is not UnreadableJson and type(checkpoint) is not UnreadableJson:
        return None
    return {
        name: value.reason
        for name, value in (("payload", payload), ("checkpoint", checkpoint))
        if type(value) is UnreadableJson
    }
