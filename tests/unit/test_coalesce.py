"""The coalescer: no wait when idle, one statement for requests that arrive while one runs,
one bad request failing only itself (no database)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from app.queue.coalesce import Coalescer, Lanes
from tests.polling import poll_until


class Statements:
    """A fake statement runner: records each call's items; can be held open or made to fail."""

    def __init__(self) -> None:
        self.calls: list[list[int]] = []
        self.gate: asyncio.Event | None = None

    async def __call__(self, items: Sequence[int]) -> list[int]:
        self.calls.append(list(items))
        if self.gate is not None:
            await self.gate.wait()
        if any(item < 0 for item in items):
            raise ValueError("a bad item")
        return [item * 10 for item in items]


async def test_an_idle_coalescer_runs_a_request_at_once() -> None:
    run = Statements()
    coalescer = Coalescer(run, max_in_flight=1, max_items=100)
    assert await coalescer.submit([1, 2]) == [10, 20]
    assert run.calls == [[1, 2]] and coalescer.idle


async def test_requests_arriving_during_a_statement_share_the_next_one() -> None:
    run = Statements()
    run.gate = asyncio.Event()
    coalescer = Coalescer(run, max_in_flight=1, max_items=100)
    first = asyncio.ensure_future(coalescer.submit([1]))
    await poll_until(lambda: len(run.calls) == 1, what="the first statement")
    later = [asyncio.ensure_future(coalescer.submit([n, n + 1])) for n in (10, 20, 30)]
    await poll_until(lambda: coalescer.waiting == 3, what="the requests to queue")
    assert len(run.calls) == 1  # nothing new runs while the first is in flight
    run.gate.set()
    assert await first == [10]
    assert [await t for t in later] == [[100, 110], [200, 210], [300, 310]]
    assert run.calls == [[1], [10, 11, 20, 21, 30, 31]]


async def test_a_bad_request_fails_alone() -> None:
    run = Statements()
    run.gate = asyncio.Event()
    coalescer = Coalescer(run, max_in_flight=1, max_items=100)
    blocker = asyncio.ensure_future(coalescer.submit([0]))
    await poll_until(lambda: len(run.calls) == 1, what="the first statement")
    good = asyncio.ensure_future(coalescer.submit([1]))
    bad = asyncio.ensure_future(coalescer.submit([-1]))
    also_good = asyncio.ensure_future(coalescer.submit([2]))
    run.gate.set()
    await blocker
    assert await good == [10] and await also_good == [20]
    with pytest.raises(ValueError, match="a bad item"):
        await bad
    # The merged statement failed, then each request ran on its own.
    assert run.calls[1] == [1, -1, 2] and run.calls[2:] == [[1], [-1], [2]]


async def test_a_request_cancelled_before_its_statement_is_withdrawn() -> None:
    run = Statements()
    run.gate = asyncio.Event()
    coalescer = Coalescer(run, max_in_flight=1, max_items=100)
    blocker = asyncio.ensure_future(coalescer.submit([0]))
    await poll_until(lambda: len(run.calls) == 1, what="the first statement")
    gone = asyncio.ensure_future(coalescer.submit([5]))
    kept = asyncio.ensure_future(coalescer.submit([6]))
    await poll_until(lambda: coalescer.waiting == 2, what="both to queue")
    gone.cancel()
    run.gate.set()
    await blocker
    assert await kept == [60]
    assert run.calls == [[0], [6]]


async def test_a_backlog_larger_than_one_statement_goes_out_in_several() -> None:
    run = Statements()
    run.gate = asyncio.Event()
    coalescer = Coalescer(run, max_in_flight=1, max_items=4)
    blocker = asyncio.ensure_future(coalescer.submit([0]))
    await poll_until(lambda: len(run.calls) == 1, what="the first statement")
    waiting = [asyncio.ensure_future(coalescer.submit([n, n])) for n in range(1, 5)]
    await poll_until(lambda: coalescer.waiting == 4, what="the backlog to queue")
    run.gate.set()
    await blocker
    assert [await t for t in waiting] == [[10, 10], [20, 20], [30, 30], [40, 40]]
    assert run.calls[1:] == [[1, 1, 2, 2], [3, 3, 4, 4]]


async def test_weighted_items_fill_a_statement_by_their_weight() -> None:
    """An item that brings several rows (a settle-and-claim call: its leases and its slots)
    takes that much of ``max_items``; one heavier than the cap still goes out, alone."""
    run = Statements()
    run.gate = asyncio.Event()
    coalescer = Coalescer(run, max_in_flight=1, max_items=10, weight=lambda item: item)
    blocker = asyncio.ensure_future(coalescer.submit([1]))
    await poll_until(lambda: len(run.calls) == 1, what="the first statement")
    waiting = [asyncio.ensure_future(coalescer.submit([n])) for n in (4, 5, 2, 12, 3)]
    await poll_until(lambda: coalescer.waiting == 5, what="the backlog to queue")
    run.gate.set()
    await blocker
    assert [await t for t in waiting] == [[40], [50], [20], [120], [30]]
    assert run.calls[1:] == [[4, 5], [2], [12], [3]]


def test_limits_are_validated() -> None:
    with pytest.raises(ValueError):
        Coalescer(Statements(), max_in_flight=0, max_items=1)


class StatementLost(Exception):
    """Stands for a lost connection: whether the statement committed is unknown."""


async def test_a_shared_error_goes_to_every_request_without_running_them_again() -> None:
    run = Statements()
    run.gate = asyncio.Event()
    lost_once = [True]

    async def flush(items: Sequence[int]) -> list[int]:
        results = await run(items)
        if len(items) > 1 and lost_once.pop():
            raise StatementLost("the connection broke after the statement was sent")
        return results

    coalescer = Coalescer(flush, max_in_flight=1, max_items=100, shared_errors=(StatementLost,))
    blocker = asyncio.ensure_future(coalescer.submit([0]))
    await poll_until(lambda: len(run.calls) == 1, what="the first statement")
    merged = [asyncio.ensure_future(coalescer.submit([n])) for n in (1, 2)]
    await poll_until(lambda: coalescer.waiting == 2, what="the requests to queue")
    run.gate.set()
    assert await blocker == [0]
    for request in merged:
        with pytest.raises(StatementLost):
            await request
    # Running each request again could repeat what may have committed: nothing ran again.
    assert run.calls == [[0], [1, 2]]


async def test_a_lane_runs_one_statement_at_a_time_per_key_and_other_keys_beside_it() -> None:
    lanes = Lanes()
    gate = asyncio.Event()
    ran: list[str] = []

    async def statement(key: str, name: str) -> None:
        async with lanes.one_at_a_time(key):
            ran.append(name)
            await gate.wait()

    first = asyncio.ensure_future(statement("a", "first"))
    await poll_until(lambda: ran == ["first"], what="the first statement")
    second = asyncio.ensure_future(statement("a", "second"))
    other = asyncio.ensure_future(statement("b", "other"))
    await poll_until(lambda: lanes.users("a") == 2, what="the second to wait for its lane")
    await poll_until(lambda: "other" in ran, what="another key's statement")
    assert ran == ["first", "other"], "the second waits while the first holds lane a"
    gate.set()
    await asyncio.gather(first, second, other)
    assert ran == ["first", "other", "second"]
    assert lanes.users("a") == lanes.users("b") == 0, "a lane nobody holds is forgotten"


async def test_a_lane_is_let_go_when_its_statement_fails() -> None:
    lanes = Lanes()
    with pytest.raises(ValueError, match="refused"):
        async with lanes.one_at_a_time("a"):
            raise ValueError("refused")
    async with asyncio.timeout(5), lanes.one_at_a_time("a"):
        assert lanes.users("a") == 1
    assert lanes.users("a") == 0
