"""Coalescing: concurrent requests of one kind share one statement, as group commit does.

A request hands its items to a :class:`Coalescer` and waits. When fewer than ``max_in_flight``
statements of this kind are running, the items go out at once, with whatever else is waiting:
an idle instance adds no wait at all. While statements are in flight, new items gather and go
out together as soon as one finishes. Each request is answered from the statement that carried
its items, after that statement committed: nothing is acknowledged before it is durable.

A merged statement that fails is run again for each request on its own, so one request's bad
item fails that request only; except for the errors that are the statement's, not an item's
(``shared_errors``: a lost connection, whose statement may have committed), which go to every
request it carried.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

ItemT = TypeVar("ItemT")
ResultT = TypeVar("ResultT")

Flush = Callable[[Sequence[ItemT]], Awaitable[Sequence[ResultT]]]


@dataclass
class _Submission(Generic[ItemT, ResultT]):
    items: Sequence[ItemT]
    done: asyncio.Future[Sequence[ResultT]] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


class Coalescer(Generic[ItemT, ResultT]):
    """Runs ``flush`` over the items of concurrent submissions, at most ``max_in_flight`` at once.

    ``flush(items)`` must answer one result per item, in order. ``max_items`` caps one statement;
    a larger backlog goes out in several. ``weight`` says how much of that cap an item takes
    (default 1: an item is a row), for items that bring several rows each.
    """

    def __init__(
        self,
        flush: Flush[ItemT, ResultT],
        *,
        max_in_flight: int,
        max_items: int,
        shared_errors: tuple[type[Exception], ...] = (),
        weight: Callable[[ItemT], int] | None = None,
    ) -> None:
        if max_in_flight < 1 or max_items < 1:
            raise ValueError("max_in_flight and max_items must be >= 1")
        self._flush = flush
        self._weight = weight
        self._shared_errors = shared_errors
        self.max_in_flight = max_in_flight
        self.max_items = max_items
        self._waiting: list[_Submission[ItemT, ResultT]] = []
        self._in_flight = 0
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def waiting(self) -> int:
        """Requests waiting for a statement to carry them."""
        return len(self._waiting)

    @property
    def idle(self) -> bool:
        """Whether nothing waits and nothing runs."""
        return not self._waiting and not self._in_flight

    async def submit(self, items: Sequence[ItemT]) -> Sequence[ResultT]:
        """The results for ``items``, once the statement carrying them has committed."""
        submission: _Submission[ItemT, ResultT] = _Submission(items)
        self._waiting.append(submission)
        self._launch()
        try:
            return await asyncio.shield(submission.done)
        except asyncio.CancelledError:
            # Not yet taken: withdraw. Taken: it runs anyway (the statement cannot be split).
            if submission in self._waiting:
                self._waiting.remove(submission)
            raise

    def _launch(self) -> None:
        while self._waiting and self._in_flight < self.max_in_flight:
            batch = self._take()
            self._in_flight += 1
            task = asyncio.create_task(self._run(batch), name="jobq-coalesced-statement")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _take(self) -> list[_Submission[ItemT, ResultT]]:
        batch: list[_Submission[ItemT, ResultT]] = []
        count = 0
        while self._waiting:
            items = self._waiting[0].items
            size = len(items) if self._weight is None else sum(map(self._weight, items))
            if batch and count + size > self.max_items:
                break
            batch.append(self._waiting.pop(0))
            count += size
        return batch

    async def _run(self, batch: list[_Submission[ItemT, ResultT]]) -> None:
        try:
            await self._answer(batch)
        finally:
            self._in_flight -= 1
            self._launch()

    async def _answer(self, batch: list[_Submission[ItemT, ResultT]]) -> None:
        items = [item for submission in batch for item in submission.items]
        try:
            results = await self._flush(items)
        except asyncio.CancelledError:
            for submission in batch:
                if not submission.done.done():
                    submission.done.cancel()
            raise
        except Exception as exc:  # noqa: BLE001 - handed to each request, or retried one by one
            if len(batch) == 1 or isinstance(exc, self._shared_errors):
                # Running the requests again one by one could repeat what may have committed.
                for submission in batch:
                    _settle(submission, exc)
                return
            # One request's item may have failed them all: each request on its own, so only
            # that request sees the error.
            for submission in batch:
                try:
                    _settle(submission, await self._flush(submission.items))
                except Exception as own:  # noqa: BLE001 - this request's own error
                    _settle(submission, own)
            return
        start = 0
        for submission in batch:
            end = start + len(submission.items)
            _settle(submission, results[start:end])
            start = end

    async def close(self) -> None:
        """Waits for the statements in flight; submissions still waiting are cancelled."""
        for submission in self._waiting:
            submission.done.cancel()
        self._waiting.clear()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError):
                await task


class Lanes:
    """One statement at a time per key, across coalescers.

    A coalescer runs one kind of statement; statements of two kinds can still fight over the
    same rows. Under limits, a claim and a settle-and-claim on the same queues each lock the
    key rows of the jobs they take and skip those the other holds, so each came back short and
    claimed again: 16 workers completing 50 jobs of 20 keys ran two in five of their jobs
    through an extra claim statement, some of them waiting for the rows.
    """

    def __init__(self) -> None:
        self._lanes: dict[Hashable, tuple[asyncio.Lock, int]] = {}

    def users(self, key: Hashable) -> int:
        """Statements holding or waiting for the lane of ``key``."""
        return self._lanes.get(key, (None, 0))[1]

    @contextlib.asynccontextmanager
    async def one_at_a_time(self, key: Hashable, *, when: bool = True) -> AsyncIterator[None]:
        """Holds the lane of ``key`` for the statement run inside it (``when`` false: none)."""
        if not when:
            yield
            return
        lock, users = self._lanes.get(key, (asyncio.Lock(), 0))
        self._lanes[key] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._lanes[key]
            if users == 1:
                del self._lanes[key]
            else:
                self._lanes[key] = (lock, users - 1)


def _settle(
    submission: _Submission[ItemT, ResultT], outcome: Sequence[ResultT] | BaseException
) -> None:
    if submission.done.done():
        return
    if isinstance(outcome, BaseException):
        submission.done.set_exception(outcome)
    else:
        submission.done.set_result(outcome)
