"""One poisoned job never stops a maintenance loop for the others: it is retried alone, then set aside.

A job whose move fails every time (here: a trigger of the operator's that refuses it; found from
outside: a long chain whose cascade overflowed the stack) made every reaper batch fail, so no
expired lease of any queue was reaped and ``/readyz`` answered 503. Now the batch is tried again
one job at a time; the job that fails alone is set aside with PostgreSQL's error, shown on
``GET /v1/maintenance/set-aside``, the dashboard and ``/metrics``, and left out of the loop's
batches until an operator puts it back.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.api.state import app_state
from app.maintenance.gauges import QueueGauges
from app.maintenance.promoter import Promoter, PromoterConfig
from app.maintenance.pruner import Pruner, PrunerConfig
from app.maintenance.reaper import Reaper, ReaperConfig
from app.queue.services import Services
from tests.api.helpers import claim, enqueue, get_job, lease, lease_call
from tests.api.test_metrics import scrape, value
from tests.keys import Keys, bearer

LATER = timedelta(days=60)  # past every lease, backoff and retention the tests use


@pytest.fixture
async def poison(clean_db: AsyncEngine) -> AsyncIterator[Callable[[int, str], Any]]:
    """Makes every UPDATE or DELETE of one job fail, as a trigger of the operator's might."""
    made: list[str] = []

    async def make(job_id: int, event: str = "UPDATE") -> None:
        async with clean_db.begin() as conn:
            await conn.execute(
                text(
                    "CREATE OR REPLACE FUNCTION test_poison() RETURNS trigger LANGUAGE plpgsql "
                    "AS $$ BEGIN RAISE EXCEPTION 'job % is poisoned', OLD.id; END $$"
                )
            )
            name = f"test_poison_{job_id}"
            await conn.execute(
                text(
                    f"CREATE TRIGGER {name} BEFORE {event} ON jobs FOR EACH ROW "
                    f"WHEN (OLD.id = {int(job_id)}) EXECUTE FUNCTION test_poison()"
                )
            )
            made.append(name)

    yield make
    async with clean_db.begin() as conn:
        for name in made:
            await conn.execute(text(f"DROP TRIGGER IF EXISTS {name} ON jobs"))


async def _cure(engine: AsyncEngine, job_id: int) -> None:
    async with engine.begin() as conn:
        await conn.execute(text(f"DROP TRIGGER test_poison_{int(job_id)} ON jobs"))


def _services(app: FastAPI) -> Services:
    return app_state(app).running().services


async def _expired(client: httpx.AsyncClient, queue: str) -> dict[str, Any]:
    job = await enqueue(client, queue=queue, max_attempts=3)
    await claim(client, queues=[queue], max_jobs=1)
    return job


async def test_a_poisoned_lease_is_set_aside_and_the_reaper_reaps_the_rest(
    app: FastAPI, client: httpx.AsyncClient, clean_db: AsyncEngine, poison: Any
) -> None:
    a, b, c = [await _expired(client, q) for q in ("a", "b", "c")]
    await poison(b["id"])
    reaper = Reaper(services=_services(app), config=ReaperConfig())
    counts = await reaper.run_once(now=datetime.now(UTC) + LATER)
    assert counts.total == 2
    assert [(await get_job(client, j["id"]))["status"] for j in (a, b, c)] == [
        "scheduled",
        "running",
        "scheduled",
    ]

    r = await client.get("/v1/maintenance/set-aside")
    assert r.status_code == 200, r.text
    [row] = r.json()["jobs"]
    assert (row["loop"], row["job_id"], row["queue"]) == ("reaper", b["id"], "b")
    assert f"job {b['id']} is poisoned" in row["error"]
    assert (row["sqlstate"], row["failures"], row["job_status"]) == ("P0001", 1, "running")

    # Left out from now on: the next batch does not fail on it, nor try it again.
    assert (await reaper.run_once(now=datetime.now(UTC) + LATER)).total == 0
    assert (await client.get("/v1/maintenance/set-aside")).json()["jobs"][0]["failures"] == 1

    [gauges] = [
        loop for loop in app_state(app).running().runner.loops if isinstance(loop, QueueGauges)
    ]
    await gauges.run_batch()
    samples = await scrape(client)
    assert value(samples, "jobq_maintenance_set_aside", loop="reaper", queue="b") == 1

    overview = await client.get("/dashboard")
    assert overview.status_code == 200
    assert "set aside by maintenance" in overview.text and f"job {b['id']}" in overview.text
    page = await client.get(f"/dashboard/jobs/{b['id']}")
    assert "is poisoned" in page.text

    # Fixed, and put back: the next pass reaps it, and the audit trail says who put it back.
    await _cure(clean_db, b["id"])
    r = await client.delete(f"/v1/maintenance/set-aside/reaper/{b['id']}")
    assert r.status_code == 200, r.text
    assert (await client.delete(f"/v1/maintenance/set-aside/reaper/{b['id']}")).status_code == 404
    assert (await reaper.run_once(now=datetime.now(UTC) + LATER)).total == 1
    assert (await get_job(client, b["id"]))["status"] == "scheduled"
    audit = (await client.get("/v1/audit", params={"action": "maintenance.put_back"})).json()
    [entry] = audit["entries"]
    assert entry["job_id"] == b["id"] and entry["detail"]["loop"] == "reaper"


async def test_the_promoter_and_the_pruner_set_a_poisoned_job_aside_too(
    app: FastAPI, client: httpx.AsyncClient, poison: Any
) -> None:
    services = _services(app)
    due = [await enqueue(client, queue="p", delay_seconds=60) for _ in range(3)]
    await poison(due[1]["id"])
    promoted = await Promoter(services=services, config=PromoterConfig()).run_once(
        now=datetime.now(UTC) + LATER
    )
    assert promoted == 2
    assert (await get_job(client, due[1]["id"]))["status"] == "scheduled"

    done = [await enqueue(client, queue="d") for _ in range(3)]
    held = await claim(client, queues=["d"], max_jobs=3)
    await lease_call(client, "complete", "w1", *(lease(j) for j in held))
    await poison(done[0]["id"], "DELETE")
    pruner = Pruner(services=services, config=PrunerConfig())
    assert (await pruner.run_once(now=datetime.now(UTC) + LATER)).jobs == 2
    assert (await client.get(f"/v1/jobs/{done[0]['id']}")).status_code == 200

    rows = (await client.get("/v1/maintenance/set-aside")).json()["jobs"]
    assert sorted((r["loop"], r["job_id"]) for r in rows) == [
        ("promoter", due[1]["id"]),
        ("pruner", done[0]["id"]),
    ]


async def test_a_scoped_key_sees_and_puts_back_only_its_queues(
    app: FastAPI, client: httpx.AsyncClient, keys: Keys, poison: Any
) -> None:
    ours = await _expired_with(client, keys, "billing.invoices")
    theirs = await _expired_with(client, keys, "mail")
    await poison(ours)
    await poison(theirs)
    await Reaper(services=_services(app), config=ReaperConfig()).run_once(
        now=datetime.now(UTC) + LATER
    )
    r = await client.get("/v1/maintenance/set-aside", headers=bearer(keys.scoped_viewer))
    assert [row["job_id"] for row in r.json()["jobs"]] == [ours]
    r = await client.delete(
        f"/v1/maintenance/set-aside/reaper/{theirs}", headers=bearer(keys.scoped_admin)
    )
    assert r.status_code == 403, r.text
    r = await client.delete(f"/v1/maintenance/set-aside/reaper/{ours}", headers=bearer(keys.viewer))
    assert r.status_code == 403, r.text
    r = await client.delete(
        f"/v1/maintenance/set-aside/reaper/{ours}", headers=bearer(keys.scoped_admin)
    )
    assert r.status_code == 200, r.text


async def _expired_with(client: httpx.AsyncClient, keys: Keys, queue: str) -> int:
    r = await client.post(
        "/v1/jobs", json={"queue": queue, "type": "t"}, headers=bearer(keys.producer)
    )
    job_id: int = r.json()["id"]
    r = await client.post(
        "/v1/claim",
        json={"worker_id": "w1", "queues": [queue], "max_jobs": 1},
        headers=bearer(keys.worker),
    )
    assert [j["id"] for j in r.json()["jobs"]] == [job_id]
    return job_id
