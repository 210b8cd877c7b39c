"""Waiting in tests: poll a condition with a deadline instead of sleeping a fixed time."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable


async def poll_until(
    condition: Callable[[], bool | Awaitable[bool]],
    *,
    within: float = 5.0,
    what: str = "the condition",
    interval: float = 0.05,
) -> None:
    """Checks ``condition`` (sync or async) every ``interval`` s until it holds; fails after ``within`` s."""
    deadline = time.monotonic() + within
    while True:
        outcome = condition()
        if not isinstance(outcome, bool):
            outcome = await outcome
        if outcome:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within} s waiting for {what}")
        await asyncio.sleep(interval)
