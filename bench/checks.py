"""What a run must leave in a ``jobs`` table: jobq's and the raw baselines', on either schema.

jobq's schema and the lean queue table (``bench/lean.py``) share the columns these checks read
(id, status, attempts), so one set of checks verifies jobq's runs, the raw-SQL baseline's on
jobq's schema and the same statements' on the lean table. Each answers its failed checks as
lines, empty when the run passed; the load process's own errors are checked apart
(``Suite.check_errors``).
"""

from __future__ import annotations

from typing import Any

DRAIN_STATE = """
SELECT count(*) AS total,
       count(*) FILTER (WHERE status <> 'succeeded') AS unfinished,
       count(*) FILTER (WHERE attempts <> 1) AS reclaimed
FROM jobs
"""


def answered(result: dict[str, Any], n: int) -> list[str]:
    """An enqueue run's own account: ``n`` jobs sent, each answered with a distinct id."""
    failures: list[str] = []
    if result["jobs"] != n:
        failures.append(f"{result['jobs']} jobs sent, not {n}")
    if result["created"] != result["jobs"] or result["created_unique"] != result["created"]:
        failures.append(
            f"{result['jobs']} jobs sent, {result['created']} ids answered "
            f"({result['created_unique']} distinct)"
        )
    return failures


def handled(done: list[int], preloaded: set[int], verb: str) -> list[str]:
    """A drain's own account: each pre-loaded job ``verb`` once, and no other."""
    failures: list[str] = []
    distinct = set(done)
    if len(distinct) != len(done):
        failures.append(f"{len(done) - len(distinct)} jobs {verb} more than once")
    if missing := preloaded - distinct:
        failures.append(f"{len(missing)} pre-loaded jobs never {verb}, e.g. {min(missing)}")
    if extra := distinct - preloaded:
        failures.append(f"{len(extra)} {verb} ids were never pre-loaded")
    return failures


async def enqueue(admin: Any, result: dict[str, Any], n: int) -> list[str]:
    """Every job was sent and answered once, and ``jobs`` holds exactly those rows."""
    failures = answered(result, n)
    rows = await admin.fetchval("SELECT count(*) FROM jobs")
    if rows != result["jobs"]:
        failures.append(f"{rows} rows in jobs after {result['jobs']} enqueued")
    return failures


async def drain(admin: Any, result: dict[str, Any], n: int) -> list[str]:
    """Every pre-loaded job completed exactly once by the load, claimed once, and succeeded."""
    stored = {row["id"] for row in await admin.fetch("SELECT id FROM jobs")}
    failures = handled(result["completed_ids"], stored, "completed")
    state = await admin.fetchrow(DRAIN_STATE)
    if state["total"] != n:
        failures.append(f"{state['total']} rows in jobs, {n} pre-loaded")
    if state["unfinished"]:
        failures.append(f"{state['unfinished']} jobs not succeeded after the drain")
    if state["reclaimed"]:
        failures.append(f"{state['reclaimed']} jobs claimed more than once (attempts > 1)")
    return failures
