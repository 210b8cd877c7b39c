"""Opaque keyset cursors for the listings: a page is read below the last id of the one before."""

from __future__ import annotations

import base64
import binascii

from app.domain.bounds import MAX_BIGINT
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
