"""Failed authentications per client address: past a budget per minute, the address gets 429.

Counted in fixed one-minute windows per address, in process (each instance counts its own).
Only failures are counted and only failures are refused: a request with a valid key never
touches the table, so a client behind the same address as an attacker keeps working. Guessing
a 256-bit secret is hopeless anyway; the budget stops a flood of bad keys from costing
database lookups.
"""

from __future__ import annotations

import time
from collections.abc import Callable

WINDOW_SECONDS = 60.0
# Addresses remembered at most; past it the oldest windows are dropped first.
MAX_ADDRESSES = 100_000


class FailureLimiter:
    """Counts authentication failures per address in one-minute windows."""

    def __init__(self, per_minute: int, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.per_minute = per_minute
        self.clock = clock
        self._windows: dict[str, tuple[float, int]] = {}  # address -> (window start, failures)

    def _window(self, address: str, now: float) -> tuple[float, int]:
        start, count = self._windows.get(address, (now, 0))
        if now - start >= WINDOW_SECONDS:
            return now, 0
        return start, count

    def retry_after(self, address: str) -> int | None:
        """Seconds until this address may try again, or ``None`` while it is within budget."""
        now = self.clock()
        start, count = self._window(address, now)
        if count < self.per_minute:
            return None
        return max(1, int(start + WINDOW_SECONDS - now + 0.999))

    def failed(self, address: str) -> None:
        """Records one failed authentication from this address."""
        now = self.clock()
        start, count = self._window(address, now)
        self._windows.pop(address, None)  # re-inserted last: dicts keep insertion order
        self._windows[address] = (start, count + 1)
        if len(self._windows) > MAX_ADDRESSES:
            del self._windows[next(iter(self._windows))]
