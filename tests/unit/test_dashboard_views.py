"""The queue page's small formatters: durations, shares and a limit's pattern (app/dashboard/views.py)."""

from __future__ import annotations

import pytest

from app.dashboard.views import duration, glob_matches, share


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [
        (None, "—"),
        (float("nan"), "—"),
        (0, "0 ms"),
        (0.0004, "0.4 ms"),
        (0.01234, "12.3 ms"),
        (0.25, "250 ms"),
        (1, "1 s"),
        (3.97, "3.97 s"),
        (42.25, "42.2 s"),
        (60, "1 min"),
        (192.4, "3 min 12 s"),
        (7500, "2 h 5 min"),
    ],
)
def test_a_duration_reads_to_three_figures_then_in_minutes(
    seconds: float | None, shown: str
) -> None:
    assert duration(seconds) == shown


def test_a_share_names_nothing_of_nothing() -> None:
    assert share(1, 6) == "16.7 %"
    assert share(0, 5) == "0.0 %"
    assert share(3, 0) == "—"


@pytest.mark.parametrize(
    ("pattern", "name", "matches"),
    [
        ("emails", "emails", True),
        ("emails", "emails2", False),
        ("em*", "emails", True),
        ("*", "anything", True),
        ("billing.*", "billing.eu", True),
        ("billing.*", "billingXeu", False),  # the dot is itself, not any character
        ("a_b", "aXb", False),  # as LIKE after like_pattern: _ is itself
        ("q*:*", "q1:x", True),
    ],
)
def test_a_limit_pattern_matches_as_the_claim_matches_it(
    pattern: str, name: str, matches: bool
) -> None:
    assert glob_matches(pattern, name) is matches
