"""Responses written once, by orjson, in exactly the shape the response models declare.

The routes keep their ``response_model`` for the OpenAPI document; on the hot routes they
return these bytes themselves, so FastAPI neither validates nor serialises the answer a second
time. ``tests/unit/test_render.py`` holds each shape against its pydantic model.
"""

from __future__ import annotations

import json
import operator
import uuid
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

import orjson
from fastapi import Response

from app.api.schemas import Job
from app.domain import records
from app.domain.types import LeaseOutcome
from app.stored_json import UnreadableJson, job_json_errors

# The model's fields that are the row's columns (stored_json_errors is added when it applies).
JOB_FIELDS: tuple[str, ...] = tuple(f for f in Job.model_fields if f != "stored_json_errors")
# Reads every field in one C call: a 50-job claim renders 50 rows.
_JOB_VALUES = operator.attrgetter(*JOB_FIELDS)
_OPTIONS = orjson.OPT_UTC_Z


def _default(value: object) -> object:
    if isinstance(value, uuid.UUID):  # asyncpg's UUID is a subclass orjson does not take as one
        return str(value)
    if isinstance(value, UnreadableJson):  # said in stored_json_errors (job_json_errors)
        return None
    raise TypeError(f"cannot encode {type(value).__name__} as JSON")


def job(row: records.Job) -> dict[str, Any]:
    """A jobs row as the ``Job`` model shows it."""
    data = dict(zip(JOB_FIELDS, _JOB_VALUES(row), strict=True))
    unreadable = job_json_errors(row)
    if unreadable is not None:
        data.update(dict.fromkeys(unreadable))
        data["stored_json_errors"] = unreadable
    return data


def claimed(row: records.Job) -> dict[str, Any]:
    """A claimed row as ``ClaimedJob``: the job and the number of this attempt."""
    data = job(row)
    data["attempt"] = row.attempts
    data["parents"] = row.parents
    return data


def lease_result(outcome: LeaseOutcome) -> dict[str, Any]:
    """One lease item's verdict as ``LeaseResult``."""
    return {
        "job_id": outcome.job_id,
        "ok": outcome.ok,
        "status": outcome.status,
        "error": None if outcome.ok else "lease_lost",
        "cancelled": outcome.cancelled,
        "timed_out": outcome.timed_out,
        "lease_expires_at": outcome.lease_expires_at,
        "run_at": outcome.run_at,
    }


def _text_default(value: object) -> object:
    if isinstance(value, datetime):
        return value.isoformat().replace("+00:00", "Z")
    return _default(value)


def json_response(content: object, *, status_code: int = 200) -> Response:
    """A JSON response written once."""
    try:
        body = orjson.dumps(content, option=_OPTIONS, default=_default)
    except orjson.JSONEncodeError:
        # An integer past 64 bits (jsonb keeps them exactly, and reads through SQLAlchemy give
        # them back as such): Python's encoder writes it.
        body = json.dumps(content, separators=(",", ":"), default=_text_default).encode()
    return Response(body, status_code=status_code, media_type="application/json")


def jobs_response(
    rows: Iterable[records.Job], *, key: str = "jobs", status_code: int = 200, **extra: Any
) -> Response:
    """``{"jobs": [...]}`` (plus ``extra`` fields) for a list of rows."""
    return json_response({key: [job(r) for r in rows], **extra}, status_code=status_code)


def lease_results_response(outcomes: Sequence[LeaseOutcome]) -> Response:
    """``LeaseResults`` for the outcomes, in order."""
    return json_response({"results": [lease_result(o) for o in outcomes]})


def settle_response(
    outcomes: Sequence[LeaseOutcome],
    claimed_rows: Sequence[records.Job],
    claim_error: Mapping[str, Any] | None = None,
) -> Response:
    """``SettleResults`` of a call with ``claim_next``: the verdicts, the claim's answer, and the
    claim's problem when it failed."""
    content: dict[str, Any] = {
        "results": [lease_result(o) for o in outcomes],
        "claimed": {"jobs": [claimed(r) for r in claimed_rows]},
    }
    if claim_error is not None:
        content["claim_error"] = dict(claim_error)
    return json_response(content)
