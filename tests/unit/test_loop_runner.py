"""The loop runner survives any error, backs off, recovers, and reports stalled loops (audit bug 6).

The old runner caught only DBAPIError and OSError: a pool timeout (sqlalchemy's TimeoutError is
not a DBAPIError) or a bug ended the reaper's task for good while the instance kept the lock.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from sqlalchemy.exc import TimeoutError as PoolTimeout

from app.maintenance.runner import LoopRunner
from tests.polling import poll_until


class ScriptedLoop:
    """A loop whose batches raise the scripted errors in turn, then succeed."""

    batch_size = None

    def __init__(self, name: str, errors: list[BaseException], *, leader_only: bool) -> None:
        self.name = name
        self.leader_only = leader_only
        self.interval_seconds = 0.01
        self.errors: Iterator[BaseException] = iter(errors)
        self.calls = 0
        self.succeeded = 0
        self.failing = False

    async def run_batch(self) -> int:
        self.calls += 1
        if self.failing:
            raise RuntimeError("still broken")
        error = next(self.errors, None)
        if error is not None:
            raise error
        self.succeeded += 1
        return 0


async def _leader() -> bool:
    return True


@pytest.fixture
def logged(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level("INFO", logger="jobq.maintenance")
    return caplog


async def test_a_pool_timeout_and_a_bug_do_not_end_a_loop(logged: pytest.LogCaptureFixture) -> None:
    loop = ScriptedLoop("reaper", [PoolTimeout("pool"), RuntimeError("bug")], leader_only=True)
    runner = LoopRunner(lead=_leader, loops=[loop], election_interval=0.01, stall_min_seconds=5)
    runner.start()
    try:
        await poll_until(lambda: loop.succeeded >= 2, within=5, what="the loop to recover")
    finally:
        await runner.stop()
    failures = [r for r in logged.records if "failed" in r.getMessage()]
    assert len(failures) == 2
    # Each failure is logged with its traceback.
    assert all(r.exc_info is not None for r in failures)
    assert {type(r.exc_info[1]) for r in failures if r.exc_info} == {PoolTimeout, RuntimeError}
    assert any("recovered" in r.getMessage() for r in logged.records)


async def test_a_loop_that_keeps_failing_is_reported_stalled_then_not(
    logged: pytest.LogCaptureFixture,
) -> None:
    healthy = ScriptedLoop("backstop", [], leader_only=False)
    broken = ScriptedLoop("reaper", [], leader_only=True)
    broken.failing = True
    runner = LoopRunner(
        lead=_leader, loops=[healthy, broken], election_interval=0.01, stall_min_seconds=0.2
    )
    runner.start()
    try:
        await poll_until(lambda: runner.stalled() == ["reaper"], within=5, what="a stall")
        assert broken.calls >= 2  # it kept trying, with a backoff
        broken.failing = False
        await poll_until(lambda: runner.stalled() == [], within=5, what="the recovery")
    finally:
        await runner.stop()


async def test_leader_only_loops_wait_for_leadership_and_are_not_stalled_meanwhile() -> None:
    async def follower() -> bool:
        return False

    loop = ScriptedLoop("pruner", [], leader_only=True)
    everywhere = ScriptedLoop("promoter", [], leader_only=False)
    runner = LoopRunner(
        lead=follower, loops=[loop, everywhere], election_interval=0.01, stall_min_seconds=0.05
    )
    runner.start()
    try:
        await poll_until(lambda: everywhere.succeeded >= 10, within=5, what="the promoter")
        assert loop.calls == 0 and runner.stalled() == []
    finally:
        await runner.stop()


async def test_a_failing_election_is_retried() -> None:
    attempts = 0

    async def flaky() -> bool:
        nonlocal attempts
        attempts += 1
        if attempts < 3:
            raise RuntimeError("election bug")
        return True

    loop = ScriptedLoop("reaper", [], leader_only=True)
    runner = LoopRunner(lead=flaky, loops=[loop], election_interval=0.01)
    runner.start()
    try:
        await poll_until(lambda: loop.succeeded >= 1, within=5, what="leadership")
    finally:
        await runner.stop()
    assert attempts >= 3


async def test_cancellation_still_stops_the_runner() -> None:
    loop = ScriptedLoop("reaper", [], leader_only=False)
    runner = LoopRunner(lead=_leader, loops=[loop])
    runner.start()
    await poll_until(lambda: loop.calls >= 1, within=5, what="a first batch")
    await asyncio.wait_for(runner.stop(), 2)
    assert runner.stalled() == []
