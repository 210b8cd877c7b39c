"""Log records as the JSON lines `jobq serve` writes, captured from the root logger in tests."""

from __future__ import annotations

import contextlib
import io
import logging
from collections.abc import Iterator

from app.logs import JsonFormatter


@contextlib.contextmanager
def json_log_lines(level: int) -> Iterator[io.StringIO]:
    """Every record at ``level`` and above, as JSON lines, for the span of the block."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    saved = root.level
    root.addHandler(handler)
    root.setLevel(level)
    try:
        yield out
    finally:
        root.removeHandler(handler)
        root.setLevel(saved)
