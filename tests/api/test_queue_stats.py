"""A queue's figures over a window (GET /v1/queues/{name}/stats), on jobs with exact timestamps.

Issue 20: a page per queue with its failure rates and wait and run time percentiles. The jobs are
written straight into the table with the times each figure reads (run_at, started_at,
finished_at), so every percentile is known exactly: PostgreSQL's percentile_cont interpolates
between the two nearest values, as ``continuous`` below does.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.queue import history
from tests.keys import Keys, as_key


def continuous(values: list[float], fraction: float) -> float:
    """The percentile as percentile_cont takes it: linear between the two nearest ranks."""
    ordered = sorted(values)
    position = fraction * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (position - low) * (ordered[high] - ordered[low])


async def finished(
    engine: AsyncEngine,
    *,
    queue: str = "stats",
    status: str = "succeeded",
    ended_by: str = "complete",
    attempts: int = 1,
    ago: float = 600,
    waited: float = 1,
    ran: float = 1,
) -> None:
    """A job that finished ``ago`` seconds ago after waiting ``waited`` and running ``ran``."""
    async with engine.begin() as conn:
        await conn.execute(
            text(
                "INSERT INTO jobs (queue, type, status, max_attempts, lease_seconds, attempts, "
                "  lease_ended_by, finished_at, started_at, run_at, created_at) "
                "SELECT :queue, 't', :status, 3, 30, :attempts, :ended_by, f, "
                "  f - make_interval(secs => :ran), "
                "  f - make_interval(secs => :ran) - make_interval(secs => :waited), "
                "  f - make_interval(secs => :ran) - make_interval(secs => :waited) "
                "FROM (SELECT now() - make_interval(secs => :ago) AS f) t"
            ),
            {
                "queue": queue,
                "status": status,
                "attempts": attempts,
                "ended_by": ended_by,
                "ago": ago,
                "waited": waited,
                "ran": ran,
            },
        )


async def cancelled_before_running(engine: AsyncEngine, queue: str = "stats") -> None:
    async with engine.begin() as conn:
        await conn.execute(
            text(
                "INSERT INTO jobs (queue, type, status, max_attempts, lease_seconds, "
                "  lease_ended_by, finished_at) "
                "VALUES (:queue, 't', 'cancelled', 3, 30, NULL, now() - interval '5 minutes')"
            ),
            {"queue": queue},
        )


async def stats(client: httpx.AsyncClient, queue: str = "stats", **params: Any) -> dict[str, Any]:
    r = await client.get(f"/v1/queues/{queue}/stats", params=params)
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


@pytest.fixture
async def known(clean_db: AsyncEngine) -> dict[str, list[float]]:
    """Jobs of queue "stats" in the last hour, one more two hours ago, one two days ago, and
    jobs elsewhere that must not count; answers the waits and runs of each window."""
    # The last hour: three succeeded (one after a failed attempt), one dead by the worker's
    # fail, one dead by an expired lease (its run is the reaper's, left out), one cancelled
    # before it ever ran.
    await finished(clean_db, attempts=1, waited=0.5, ran=1)
    await finished(clean_db, attempts=2, waited=1.5, ran=2)
    await finished(clean_db, attempts=1, waited=2.5, ran=3)
    await finished(clean_db, status="dead", ended_by="fail", attempts=3, waited=3.5, ran=4)
    await finished(clean_db, status="dead", ended_by="expire", attempts=3, waited=4.5, ran=100)
    await cancelled_before_running(clean_db)
    # The last 24 hours, not the last hour.
    await finished(clean_db, attempts=1, ago=2 * 3600, waited=10, ran=10)
    # Neither window; and another queue's job, and an unfinished one.
    await finished(clean_db, attempts=1, ago=2 * 86_400, waited=99, ran=99)
    await finished(clean_db, queue="elsewhere", waited=50, ran=50)
    async with clean_db.begin() as conn:
        await conn.execute(
            text(
                "INSERT INTO jobs (queue, type, max_attempts, lease_seconds) "
                "VALUES ('stats', 't', 3, 30)"
            )
        )
    return {
        "hour_waits": [0.5, 1.5, 2.5, 3.5, 4.5],
        "hour_runs": [1, 2, 3, 4],
        "day_waits": [0.5, 1.5, 2.5, 3.5, 4.5, 10],
        "day_runs": [1, 2, 3, 4, 10],
    }


async def test_the_last_hour_counts_rates_and_exact_percentiles(
    client: httpx.AsyncClient, known: dict[str, list[float]]
) -> None:
    body = await stats(client, window_seconds=3600)
    assert body["queue"] == "stats" and body["window_seconds"] == 3600
    assert (body["succeeded"], body["dead"], body["cancelled"]) == (3, 2, 1)
    assert body["finished"] == 6
    assert body["dead_rate"] == pytest.approx(2 / 6)
    # Attempts 1 + 2 + 1 + 3 + 3; failed: the succeeded job's first, both dead jobs' three each.
    assert (body["attempts"], body["failed_attempts"]) == (10, 7)
    assert body["failed_attempt_rate"] == pytest.approx(0.7)
    waits, runs = known["hour_waits"], known["hour_runs"]
    assert body["wait_seconds"]["jobs"] == 5
    assert body["run_seconds"]["jobs"] == 4  # the expired lease's "run" is left out
    for name, fraction in (("p50", 0.5), ("p95", 0.95), ("p99", 0.99)):
        assert body["wait_seconds"][name] == pytest.approx(continuous(waits, fraction))
        assert body["run_seconds"][name] == pytest.approx(continuous(runs, fraction))
    assert body["wait_seconds"]["p50"] == pytest.approx(2.5)
    assert body["run_seconds"]["p95"] == pytest.approx(3.85)
    assert body["truncated"] is False
    assert body["scanned"] == 8  # every finished job of the queue, none of another's


async def test_the_last_day_takes_in_the_older_job(
    client: httpx.AsyncClient, known: dict[str, list[float]]
) -> None:
    body = await stats(client, window_seconds=86_400)
    assert (body["succeeded"], body["dead"], body["cancelled"]) == (4, 2, 1)
    assert (body["attempts"], body["failed_attempts"]) == (11, 7)
    for name, fraction in (("p50", 0.5), ("p95", 0.95), ("p99", 0.99)):
        assert body["wait_seconds"][name] == pytest.approx(continuous(known["day_waits"], fraction))
        assert body["run_seconds"][name] == pytest.approx(continuous(known["day_runs"], fraction))
    assert body["run_seconds"]["p99"] == pytest.approx(9.76)
    default = await stats(client)
    assert default["window_seconds"] == 3600 and default["succeeded"] == 3


async def test_a_queue_with_nothing_finished_answers_zeros_and_nulls(
    client: httpx.AsyncClient, clean_db: AsyncEngine
) -> None:
    assert (await client.put("/v1/queues/quiet")).status_code == 201
    body = await stats(client, "quiet")
    assert body["finished"] == 0 and body["dead_rate"] is None
    assert body["failed_attempt_rate"] is None
    assert body["wait_seconds"] == {"jobs": 0, "p50": None, "p95": None, "p99": None}
    assert body["run_seconds"] == {"jobs": 0, "p50": None, "p95": None, "p99": None}


async def test_a_capped_read_says_the_window_may_hold_more(
    client: httpx.AsyncClient, known: dict[str, list[float]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(history, "QUEUE_STATS_SCANNED_MAX", 3)
    body = await stats(client, window_seconds=3600)
    # The newest three succeeded jobs, and the dead and cancelled ones as far back as those
    # reach: one id range for every state.
    assert body["truncated"] is True
    assert body["scanned"] == 6
    assert (body["succeeded"], body["dead"], body["cancelled"]) == (1, 2, 1)


@pytest.mark.parametrize("value", ["0", "-5", "abc", "nan", "inf", str(30 * 86_400 + 1), "1e400"])
async def test_an_unusable_window_is_a_problem_naming_the_field(
    client: httpx.AsyncClient, clean_db: AsyncEngine, value: str
) -> None:
    await finished(clean_db)
    r = await client.get("/v1/queues/stats/stats", params={"window_seconds": value})
    assert r.status_code == 422, r.text
    assert r.headers["content-type"] == "application/problem+json"
    assert [e["field"] for e in r.json()["errors"]] == ["query.window_seconds"]


async def test_unknown_and_malformed_queues(
    client: httpx.AsyncClient, clean_db: AsyncEngine
) -> None:
    r = await client.get("/v1/queues/nowhere/stats")
    assert r.status_code == 404
    assert r.headers["content-type"] == "application/problem+json"
    assert r.json()["detail"] == "queue nowhere not found"
    r = await client.get("/v1/queues/-bad/stats")
    assert r.status_code == 422
    assert [e["field"] for e in r.json()["errors"]] == ["path.name"]


async def test_a_key_sees_the_figures_of_its_own_queues_only(
    client: httpx.AsyncClient, keys: Keys, clean_db: AsyncEngine
) -> None:
    await finished(clean_db, queue="billing.invoices")
    await finished(clean_db, queue="emails")
    async with as_key(client, keys.scoped_viewer) as viewer:
        assert (await stats(viewer, "billing.invoices"))["succeeded"] == 1
        r = await viewer.get("/v1/queues/emails/stats")
        assert r.status_code == 403
        assert r.json()["errors"] == [
            {"field": "path.name", "message": "queue outside the key's scopes"}
        ]
    async with as_key(client, keys.worker) as worker:
        assert (await worker.get("/v1/queues/emails/stats")).status_code == 403
    async with as_key(client, keys.viewer) as viewer:
        assert (await stats(viewer, "emails"))["succeeded"] == 1
