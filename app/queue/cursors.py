"""Opaque keyset cursors for the listings: a page is read below the last id of the one before."""

from __future__ import annotations

import base64
import binascii
from datetime import datetime

from app.domain.bounds import MAX_BIGINT, instant_in_window
from app.errors import InvalidInput


def encode_cursor(job_id: int) -> str:
    """An opaque keyset cursor for the listing."""
    return base64.urlsafe_b64encode(f"v1:{job_id}".encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> int:
    """The job id behind a cursor; a malformed one is a 422 naming ``after``."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode("ascii")
        version, _, value = raw.partition(":")
        job_id = int(value)
        if version != "v1" or not 1 <= job_id <= MAX_BIGINT + 1:
            raise ValueError(raw)
    except (ValueError, UnicodeDecodeError, binascii.Error):
        raise InvalidInput(
            "malformed cursor", errors=[{"field": "query.after", "message": "malformed cursor"}]
        ) from None
    return job_id


def encode_event_cursor(at: datetime, event_id: int) -> str:
    """An opaque keyset cursor for a job's history: the last event's instant and id."""
    return base64.urlsafe_b64encode(f"e1:{at.isoformat()}|{event_id}".encode()).decode().rstrip("=")


def decode_event_cursor(cursor: str) -> tuple[datetime, int]:
    """The position behind a history cursor; a malformed one is a 422 naming ``after``."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode("ascii")
        version, _, value = raw.partition(":")
        at_text, _, id_text = value.partition("|")
        at = instant_in_window(datetime.fromisoformat(at_text))
        event_id = int(id_text)
        if version != "e1" or not 0 <= event_id <= MAX_BIGINT:
            raise ValueError(raw)
    except (ValueError, UnicodeDecodeError, binascii.Error):
        raise InvalidInput(
            "malformed cursor", errors=[{"field": "query.after", "message": "malformed cursor"}]
        ) from None
    return at, event_id
