"""Enqueue (single, batch, idempotent), read, list with keyset pagination."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
from fastapi import FastAPI
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.api.state import app_state
from tests.api.helpers import enqueue
from tests.keys import Keys

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


async def test_idempotency_key_header_replay_and_reuse(client: httpx.AsyncClient) -> None:
    body = {"queue": "emails", "type": "welcome", "payload": {"user": 1}}
    first = await client.post("/v1/jobs", json=body, headers={"Idempotency-Key": "k1"})
    again = await client.post("/v1/jobs", json=body, headers={"Idempotency-Key": "k1"})
    assert first.status_code == 201 and again.status_code == 200
    assert again.json()["id"] == first.json()["id"]
    assert first.json()["idempotency_key"] == "k1"

    other = await client.post(
        "/v1/jobs", json={**body, "payload": {"user": 2}}, headers={"Idempotency-Key": "k1"}
    )
    assert other.status_code == 422
    assert other.headers["content-type"].startswith("application/problem+json")
    assert other.json()["errors"][0]["field"] == "idempotency_key"

    # Keys are per queue.
    elsewhere = await client.post(
        "/v1/jobs", json={**body, "queue": "sms"}, headers={"Idempotency-Key": "k1"}
    )
    assert elsewhere.status_code == 201 and elsewhere.json()["id"] != first.json()["id"]


async def test_idempotency_key_field_and_conflicting_header(client: httpx.AsyncClient) -> None:
    body = {"type": "t", "idempotency_key": "abc"}
    assert (await client.post("/v1/jobs", json=body)).status_code == 201
    assert (await client.post("/v1/jobs", json=body)).status_code == 200
    r = await client.post("/v1/jobs", json=body, headers={"Idempotency-Key": "other"})
    assert r.status_code == 422


async def test_parallel_enqueues_with_one_key_create_one_job(
    client: httpx.AsyncClient, clean_db: AsyncEngine
) -> None:
    body = {"queue": "q", "type": "t", "payload": {"n": 1}}
    responses = await asyncio.gather(
        *[
            client.post("/v1/jobs", json=body, headers={"Idempotency-Key": "same"})
            for _ in range(20)
        ]
    )
    codes = sorted(r.status_code for r in responses)
    assert codes == [200] * 19 + [201], codes
    assert len({r.json()["id"] for r in responses}) == 1
    async with clean_db.connect() as conn:
        assert (await conn.execute(text("SELECT count(*) FROM jobs"))).scalar_one() == 1


async def test_batch_enqueue_in_order(client: httpx.AsyncClient) -> None:
    jobs = [{"queue": "b", "type": f"t{i}", "payload": i} for i in range(50)]
    r = await client.post("/v1/jobs/batch", json={"jobs": jobs})
    assert r.status_code == 201
    answered = r.json()["jobs"]
    assert [j["type"] for j in answered] == [f"t{i}" for i in range(50)]
    assert [j["payload"] for j in answered] == list(range(50))
    ids = [j["id"] for j in answered]
    assert ids == sorted(ids) and len(set(ids)) == 50


async def test_batch_is_all_or_nothing(client: httpx.AsyncClient, clean_db: AsyncEngine) -> None:
    await client.post("/v1/jobs", json={"type": "t", "idempotency_key": "taken", "payload": 1})
    batch = {
        "jobs": [
            {"type": "t", "payload": "fine"},
            {"type": "t", "idempotency_key": "taken", "payload": 2},  # reuse, different request
        ]
    }
    r = await client.post("/v1/jobs/batch", json=batch)
    assert r.status_code == 422
    assert r.json()["errors"][0]["field"] == "body.jobs[1].idempotency_key"
    async with clean_db.connect() as conn:
        assert (await conn.execute(text("SELECT count(*) FROM jobs"))).scalar_one() == 1

    bad = {"jobs": [{"type": "t"}, {"type": "t", "queue": "no spaces"}]}
    r = await client.post("/v1/jobs/batch", json=bad)
    assert r.status_code == 422 and r.json()["errors"][0]["field"] == "body.jobs[1].queue"


async def test_batch_replay_answers_existing_jobs(client: httpx.AsyncClient) -> None:
    batch = {"jobs": [{"type": "t", "idempotency_key": f"k{i}"} for i in range(3)]}
    first = await client.post("/v1/jobs/batch", json=batch)
    again = await client.post("/v1/jobs/batch", json=batch)
    assert first.status_code == 201 and again.status_code == 200
    assert [j["id"] for j in again.json()["jobs"]] == [j["id"] for j in first.json()["jobs"]]


async def test_batch_limits(client: httpx.AsyncClient) -> None:
    assert (await client.post("/v1/jobs/batch", json={"jobs": []})).status_code == 422


async def test_get_unknown_and_out_of_range_ids_are_404(client: httpx.AsyncClient) -> None:
    for job_id in ("12345", "0", "-1", "9223372036854775808", "99999999999999999999999999"):
        for method, path in (
            ("GET", f"/v1/jobs/{job_id}"),
            ("POST", f"/v1/jobs/{job_id}/cancel"),
            ("POST", f"/v1/jobs/{job_id}/retry"),
        ):
            r = await client.request(method, path)
            assert r.status_code == 404, (method, path, r.text)
            assert r.headers["content-type"].startswith("application/problem+json")


async def test_list_filters_and_keyset_pagination(client: httpx.AsyncClient) -> None:
    created = [
        await enqueue(client, queue="a" if i % 2 else "b", type=f"t{i % 3}") for i in range(7)
    ]
    seen: list[int] = []
    cursor = None
    while True:
        params = {"limit": 3, **({"after": cursor} if cursor else {})}
        page = (await client.get("/v1/jobs", params=params)).json()
        seen += [j["id"] for j in page["jobs"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == sorted((j["id"] for j in created), reverse=True)

    only_a = (await client.get("/v1/jobs", params={"queue": "a"})).json()["jobs"]
    assert {j["queue"] for j in only_a} == {"a"} and len(only_a) == 3
    t0 = (await client.get("/v1/jobs", params={"type": "t0"})).json()["jobs"]
    assert len(t0) == 3
    await client.post(f"/v1/jobs/{created[0]['id']}/cancel")
    cancelled = (await client.get("/v1/jobs", params={"status": "cancelled"})).json()["jobs"]
    assert [j["id"] for j in cancelled] == [created[0]["id"]]
    pending = (await client.get("/v1/jobs", params={"status": "pending"})).json()["jobs"]
    assert len(pending) == 6


async def test_list_scheduled_status(client: httpx.AsyncClient) -> None:
    later = await enqueue(client, delay_seconds=600)
    await enqueue(client)
    page = (await client.get("/v1/jobs", params={"status": "scheduled"})).json()
    assert [j["id"] for j in page["jobs"]] == [later["id"]]


async def test_list_rejects_bad_cursor_and_status(client: httpx.AsyncClient) -> None:
    r = await client.get("/v1/jobs", params={"after": "!!not-a-cursor"})
    assert r.status_code == 422 and r.json()["errors"][0]["field"] == "query.after"
    r = await client.get("/v1/jobs", params={"status": "exploded"})
    assert r.status_code == 422 and r.json()["errors"][0]["field"] == "query.status"
    r = await client.get("/v1/jobs", params={"limit": 0})
    assert r.status_code == 422


async def test_run_at_in_past_is_due(client: httpx.AsyncClient) -> None:
    # A run_at without an offset is refused (tests/api/test_strict_input.py).
    job = await enqueue(client, run_at="2020-01-01T00:00:00Z")
    assert job["status"] == "pending" and job["run_at"].startswith("2020-01-01T00:00:00")
    r = await client.post(
        "/v1/jobs", json={"type": "t", "run_at": "2030-01-01T00:00:00Z", "delay_seconds": 5}
    )
    assert r.status_code == 422


async def test_a_plain_batch_stores_what_a_keyed_batch_of_the_same_jobs_stores(
    app: FastAPI, client: httpx.AsyncClient, keys: Keys, clean_db: AsyncEngine
) -> None:
    # A batch without keys, parents or ordering keys is sent as its requests' own fields and
    # the statement fills in the defaults (PlainJobs); a keyed batch goes job by job through
    # NewJob. Both must store the same rows.
    producer = {"Authorization": f"Bearer {keys.producer}", "traceparent": TRACEPARENT}
    jobs: list[dict[str, Any]] = [
        {"type": "bare"},
        {"type": "nulls", "queue": "q", "payload": None, "max_attempts": None, "run_at": None},
        {
            "type": "full",
            "queue": "q",
            "payload": {"a": [1, "x", None]},
            "priority": -5,
            "run_at": "2031-02-03T04:05:06.789+01:00",
            "max_attempts": 7,
            "lease_seconds": 45,
            "timeout_seconds": 90,
            "concurrency_key": "c:1",
            "callback_url": "https://example.com/done",
        },
        {"type": "later", "delay_seconds": 3600.5, "payload": "text"},
    ]
    plain = await client.post("/v1/jobs/batch", json={"jobs": jobs}, headers=producer)
    keyed = await client.post(
        "/v1/jobs/batch",
        json={"jobs": [{**job, "idempotency_key": f"k{i}"} for i, job in enumerate(jobs)]},
        headers=producer,
    )
    assert (plain.status_code, keyed.status_code) == (201, 201), (plain.text, keyed.text)
    columns = (
        "queue, type, payload, priority, status, max_attempts, lease_seconds, timeout_seconds,"
        " run_at - created_at AS ahead, concurrency_key, traceparent, callback_url,"
        " callback_key_id"
    )
    stored = {}
    async with clean_db.connect() as conn:
        for kind, keyed_or_not in (("plain", "IS NULL"), ("keyed", "IS NOT NULL")):
            found = await conn.execute(
                text(f"SELECT {columns} FROM jobs WHERE idempotency_key {keyed_or_not} ORDER BY id")
            )
            stored[kind] = [dict(row) for row in found.mappings()]
        full_run_at = (
            await conn.execute(text("SELECT run_at FROM jobs WHERE type = 'full' LIMIT 1"))
        ).scalar_one()
    for kind in ("plain", "keyed"):  # run_at - created_at: fixed run_at, created apart
        stored[kind][2].pop("ahead")
        later = stored[kind][3].pop("ahead")
        assert abs(later.total_seconds() - 3600.5) < 60
    assert stored["plain"] == stored["keyed"]
    bare, nulls, full, later_job = stored["plain"]
    assert (bare["queue"], bare["priority"], bare["payload"]) == ("default", 0, None)
    defaults = app_state(app).settings
    assert bare["max_attempts"] == nulls["max_attempts"] == defaults.max_attempts_default
    assert bare["ahead"].total_seconds() == 0 and later_job["status"] == "scheduled"
    assert bare["traceparent"] == TRACEPARENT and full["callback_key_id"] is not None
    assert full_run_at.isoformat() == "2031-02-03T03:05:06.789000+00:00"


async def test_a_plain_batch_keeps_integers_past_64_bits_beside_an_instant(
    client: httpx.AsyncClient, clean_db: AsyncEngine
) -> None:
    # orjson refuses such integers, so the items are written by Python's encoder, which must
    # then write the validated run_at too.
    big = 2**70 + 1
    body = {"jobs": [{"type": "t", "payload": {"n": big}, "run_at": "2031-01-01T00:00:00Z"}]}
    r = await client.post("/v1/jobs/batch?answer=ids", json=body)
    assert r.status_code == 201, r.text
    async with clean_db.connect() as conn:
        stored = (await conn.execute(text("SELECT payload->>'n', run_at FROM jobs"))).one()
    assert stored[0] == str(big) and stored[1].isoformat() == "2031-01-01T00:00:00+00:00"
    # Read back through the hot path's jsonb decoding, exactly.
    [job_id] = r.json()["ids"]
    read = await client.get(f"/v1/jobs/{job_id}")
    assert read.status_code == 200 and read.json()["payload"] == {"n": big}, read.text
