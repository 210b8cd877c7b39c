"""Instants and integers outside what the storage holds are refused before any SQL runs (audit bug 1).

Before the fix, ``run_at`` values that PostgreSQL stores but the driver cannot read back were
committed, the enqueue answered 500, and every later read or claim touching the row answered
500 too: one request jammed a queue.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.api.helpers import claim, enqueue

OUT_OF_WINDOW = [
    "0001-01-01T00:00:00+05:00",  # 1 BC in UTC
    "9999-12-31T23:59:59-05:00",  # year 10000 in UTC
    "1969-12-31T23:59:59Z",
    "9000-01-01T00:00:00Z",
]


async def _count(engine: AsyncEngine) -> int:
    async with engine.connect() as conn:
        return int((await conn.execute(text("SELECT count(*) FROM jobs"))).scalar_one())


def _field_of(response: httpx.Response) -> list[str]:
    assert response.status_code == 422, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    return [e["field"] for e in response.json()["errors"]]


@pytest.mark.parametrize("run_at", OUT_OF_WINDOW)
async def test_run_at_outside_the_window_is_422_and_nothing_is_written(
    client: httpx.AsyncClient, clean_db: AsyncEngine, run_at: str
) -> None:
    r = await client.post("/v1/jobs", json={"type": "t", "run_at": run_at})
    assert _field_of(r) == ["body.run_at"]
    batch = {"jobs": [{"type": "t"}, {"type": "t", "run_at": run_at}]}
    r = await client.post("/v1/jobs/batch", json=batch)
    assert _field_of(r) == ["body.jobs[1].run_at"]
    assert await _count(clean_db) == 0


@pytest.mark.parametrize(
    ("run_at", "status"),
    [("1970-01-01T05:00:00+05:00", "pending"), ("8999-12-31T23:59:59Z", "scheduled")],
)
async def test_run_at_at_the_window_edges_is_taken_and_readable(
    client: httpx.AsyncClient, run_at: str, status: str
) -> None:
    job = await enqueue(client, run_at=run_at)
    assert job["status"] == status
    assert (await client.get(f"/v1/jobs/{job['id']}")).status_code == 200
    assert (await client.get("/v1/jobs")).status_code == 200


async def test_the_database_refuses_an_unreadable_run_at_from_any_client(
    clean_db: AsyncEngine,
) -> None:
    # Defence in depth for writers other than this service: such a row can never be stored.
    with pytest.raises(IntegrityError, match="ck_jobs_run_at_window"):
        async with clean_db.begin() as conn:
            await conn.execute(
                text(
                    "INSERT INTO jobs (queue, type, max_attempts, lease_seconds, run_at) "
                    "VALUES ('q', 't', 1, 30, '0001-01-01 00:00:00+05')"
                )
            )


async def test_old_run_at_does_not_fail_a_claim_for_the_healthy_jobs(
    client: httpx.AsyncClient, clean_db: AsyncEngine
) -> None:
    # The earliest accepted instant sorts first; the claim hands out all three and charges each
    # one attempt.
    first = await enqueue(client, run_at="1970-01-01T00:00:00Z")
    others = [await enqueue(client) for _ in range(2)]
    got = await claim(client, max_jobs=5)
    assert [j["id"] for j in got] == [first["id"], *(j["id"] for j in others)]
    assert all(j["attempt"] == 1 for j in got)


INT_CASES: list[tuple[str, dict[str, Any], str]] = [
    ("/v1/jobs", {"type": "t", "priority": 2**31}, "body.priority"),
    ("/v1/jobs", {"type": "t", "priority": -(2**31) - 1}, "body.priority"),
    ("/v1/jobs", {"type": "t", "timeout_seconds": 2**31}, "body.timeout_seconds"),
    ("/v1/jobs", {"type": "t", "lease_seconds": 2**31}, "body.lease_seconds"),
    ("/v1/jobs", {"type": "t", "max_attempts": 2**31}, "body.max_attempts"),
    ("/v1/jobs", {"type": "t", "delay_seconds": 1e300}, "body.delay_seconds"),
    (
        "/v1/claim",
        {"worker_id": "w", "queues": ["q"], "lease_seconds": 2**31},
        "body.lease_seconds",
    ),
]


@pytest.mark.parametrize(("path", "body", "field"), INT_CASES)
async def test_numbers_past_their_column_are_422_naming_the_field(
    client: httpx.AsyncClient, clean_db: AsyncEngine, path: str, body: dict[str, Any], field: str
) -> None:
    assert _field_of(await client.post(path, json=body)) == [field]
    assert await _count(clean_db) == 0


async def test_priority_at_the_int4_edges_is_taken(client: httpx.AsyncClient) -> None:
    low = await enqueue(client, priority=-(2**31))
    high = await enqueue(client, priority=2**31 - 1)
    got = await claim(client, max_jobs=2)
    assert [j["id"] for j in got] == [high["id"], low["id"]]


async def test_computed_instants_stay_readable_at_their_maxima(
    client: httpx.AsyncClient,
) -> None:
    # The largest delay, retry_after_seconds and release delay each give a readable run_at.
    far = await enqueue(client, delay_seconds=10 * 366 * 24 * 3600)
    assert far["status"] == "scheduled"
    await enqueue(client, timeout_seconds=7 * 24 * 3600, lease_seconds=12 * 3600)
    [c] = await claim(client, lease_seconds=12 * 3600)
    r = await client.post(
        "/v1/fail",
        json={
            "worker_id": "w1",
            "leases": [
                {"job_id": c["id"], "lease_id": c["lease_id"], "retry_after_seconds": 2592000}
            ],
        },
    )
    assert r.status_code == 200 and r.json()["results"][0]["status"] == "scheduled"
    listing = await client.get("/v1/jobs")
    assert listing.status_code == 200 and len(listing.json()["jobs"]) == 2


async def test_idempotency_key_header_on_a_batch_is_refused_naming_it(
    client: httpx.AsyncClient, clean_db: AsyncEngine
) -> None:
    # Audit bug 7: it used to be ignored silently, so a retried batch was enqueued twice.
    r = await client.post(
        "/v1/jobs/batch", json={"jobs": [{"type": "t"}]}, headers={"Idempotency-Key": "k"}
    )
    assert _field_of(r) == ["header.Idempotency-Key"]
    assert await _count(clean_db) == 0
