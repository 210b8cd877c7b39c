"""Retrying the service's calls: which failures are worth repeating, and the pauses between tries."""

from __future__ import annotations

import json

import httpx

from jobq_client.errors import JobqError

BACKOFF_FIRST_SECONDS = 0.2
BACKOFF_CAP_SECONDS = 5.0


def is_transient(exc: BaseException) -> bool:
    """Whether a failed call is worth repeating: no connection, a timeout, a 5xx / 429, bad JSON."""
    if isinstance(exc, JobqError):
        return exc.transient
    return isinstance(exc, httpx.TransportError | json.JSONDecodeError)


def is_dropped(exc: BaseException) -> bool:
    """Whether the connection broke before any answer came: closed, reset, or never opened.

    What a pooled connection the server closed for idleness gives when a request goes out on it
    at that moment; a timeout is not one (the service may still be working on the request).
    """
    return isinstance(
        exc,
        httpx.RemoteProtocolError | httpx.ReadError | httpx.WriteError | httpx.ConnectError,
    )


def describe(exc: BaseException) -> str:
    """The exception's type and message on one line, for the log."""
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class Backoff:
    """Exponential pauses between retries of a failing call, reset on success."""

    def __init__(self) -> None:
        self._next = BACKOFF_FIRST_SECONDS

    def next(self) -> float:
        """The pause before the next try; each is twice the last, up to the cap."""
        delay = self._next
        self._next = min(self._next * 2, BACKOFF_CAP_SECONDS)
        return delay

    def reset(self) -> None:
        """Starts over from the shortest pause."""
        self._next = BACKOFF_FIRST_SECONDS
