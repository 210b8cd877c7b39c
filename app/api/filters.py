"""The job search filters as the API and the dashboard both read them: one set of rules, one search.

The API declares its query and body fields with these rules (so OpenAPI shows them) and the
dashboard checks its form fields with the same ones; both turn what they read into the core's
:class:`~app.domain.types.JobSearch` through :func:`job_search`. Errors name the field as the
caller spells it: ``query.payload`` or ``body.queue`` for the API, the form's own field name
(``payload``, ``queue``) for the dashboard, hence the ``field`` / ``prefix`` arguments.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import datetime
from functools import cache
from typing import Any

from fastapi.exceptions import RequestValidationError

from app.api.auth import allow_queue
from app.auth.keys import Principal
from app.domain.states import JobStatus
from app.domain.types import JobSearch
from app.errors import InvalidInput
from app.http.strict_json import parse_strict_json

PAYLOAD_FILTER_MAX_CHARS = 4096
# A keyset position (``next_cursor``) as a client may pass it back.
CURSOR_MAX_CHARS = 200
# The state filter's name for scheduled jobs waiting out a retry's backoff.
RETRYING = "retrying"
# An error-text search (``last_error ILIKE``): a phrase, not a document.
ERROR_FILTER_MAX_CHARS = 200
# No NUL: text columns cannot hold it, so it would only fail inside PostgreSQL.
NO_NUL_PATTERN = r"^[^\x00]+$"


def queue_name_pattern(max_chars: int) -> str:
    """The pattern of a queue name at most ``max_chars`` long (``JOBQ_QUEUE_NAME_MAX_CHARS``)."""
    return rf"^[A-Za-z0-9][A-Za-z0-9_.:-]{{0,{max_chars - 1}}}$"


@cache
def _compiled(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern)


def is_queue_name(text: str, max_chars: int) -> bool:
    """Whether ``text`` is a queue name at most ``max_chars`` long."""
    return _compiled(queue_name_pattern(max_chars)).fullmatch(text) is not None


def is_job_type(text: str, max_chars: int) -> bool:
    """Whether ``text`` is a usable job type filter: 1 to ``max_chars`` characters, no NUL."""
    return 0 < len(text) <= max_chars and "\x00" not in text


def is_cursor(text: str) -> bool:
    """Whether ``text`` could be a keyset position; the service decodes it and says if it is not."""
    return len(text) <= CURSOR_MAX_CHARS and text.isascii()


def payload_filter(text: str, *, field: str = "query.payload") -> Any:
    """A payload search given as JSON text (``{"user": 42}``), parsed as strictly as a body."""
    if len(text) > PAYLOAD_FILTER_MAX_CHARS:
        message = f"must be at most {PAYLOAD_FILTER_MAX_CHARS} characters of JSON"
    else:
        try:
            return parse_strict_json(text.encode())
        except RequestValidationError as exc:
            message = str(exc.errors()[0].get("msg", "invalid JSON"))
    raise InvalidInput(f"payload filter: {message}", errors=[{"field": field, "message": message}])


def job_search(
    principal: Principal,
    *,
    prefix: str,
    queue: str | None = None,
    status: str | None = None,
    type: str | None = None,
    payload: Any = None,
    created_after: datetime | None = None,
    created_before: datetime | None = None,
    error: str | None = None,
    ids: Sequence[int] | None = None,
    retrying: bool | None = None,
) -> JobSearch:
    """The search these filters ask for, within the key's scopes (403 naming ``{prefix}queue``).

    A queue named must be one the key covers; without one, a scoped key sees its queues only.
    ``status`` is a stored state, or ``retrying`` (scheduled jobs waiting out a retry's backoff).
    """
    if queue is not None:
        allow_queue(principal, queue, field=f"{prefix}queue")
    patterns = principal.like_patterns() if queue is None else None
    if status == RETRYING:
        status, retrying = JobStatus.SCHEDULED, True
    return JobSearch(
        queue=queue,
        status=JobStatus(status) if status is not None else None,
        type=type,
        payload=payload,
        created_after=created_after,
        created_before=created_before,
        queue_patterns=tuple(patterns) if patterns is not None else None,
        error=error,
        ids=tuple(ids) if ids is not None else None,
        retrying=retrying,
    )
