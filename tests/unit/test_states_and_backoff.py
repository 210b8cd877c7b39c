"""Job states, legal operations and the backoff ceiling (pure)."""

from __future__ import annotations

import pytest

from app.queue.states import JobStatus, backoff_ceiling, can_cancel, can_retry


@pytest.mark.parametrize(
    ("status", "cancel", "retry"),
    [
        (JobStatus.PENDING, True, False),
        (JobStatus.RUNNING, True, False),
        (JobStatus.SUCCEEDED, False, True),
        (JobStatus.DEAD, False, True),
        (JobStatus.CANCELLED, False, True),
    ],
)
def test_transitions(status: JobStatus, cancel: bool, retry: bool) -> None:
    assert can_cancel(status) is cancel
    assert can_retry(status) is retry


def test_backoff_doubles_and_caps() -> None:
    ceilings = [backoff_ceiling(attempt=a, base_seconds=1, cap_seconds=3600) for a in range(1, 15)]
    assert ceilings[:5] == [1, 2, 4, 8, 16]
    assert ceilings[-1] == 3600 and max(ceilings) == 3600


def test_backoff_survives_huge_attempt_numbers() -> None:
    assert backoff_ceiling(attempt=10**9, base_seconds=1, cap_seconds=60) == 60
    assert backoff_ceiling(attempt=0, base_seconds=2, cap_seconds=60) == 2
