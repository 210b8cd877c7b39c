"""JSON that only the SQL path (or an older version, or a hand) put in ``jobs`` breaks no read.

``jobq.enqueue()`` checked only a payload's size: ``{"n": 1e5000}`` (jsonb keeps 5,001 digits) or
nesting past the API's depth was stored, and then every claim that took such a job answered 500
after its claim committed (the job and every job claimed with it came back after their leases,
again and again), and ``GET /v1/jobs/{id}`` and the queue's listing answered 500. Now the
function refuses what the API refuses, and a row that got in anyway is read row by row: it shows
its unreadable fields as null with ``stored_json_errors``, and a claim fails it at once.
"""

from __future__ import annotations

from typing import Any

import asyncpg
import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.api.helpers import claim, enqueue

HALF_WAY = "179769313486231580793728971405303415079934132710037826936173778980444968292764750946649017977587207096330286416692887910946555547851940402630657488671505820681908902000708383676273854845817711531764475730270069855571366959622842914819860834936475292719074168444365510704342711559699508093042880177904174497792"

# Payload texts either side of each rule (POST /v1/jobs nests its payload one level below the
# body's object, so 63 levels of payload are the default 64 of JOBQ_MAX_JSON_DEPTH).
PAYLOADS = {
    "1e5000": False,
    "-1e5000": False,
    "1e400": False,
    "1" + "0" * 400: False,  # the same value as 1e400 once jsonb holds it
    "1.7976931348623157e308": True,  # the largest double
    "1.7976931348623158e308": True,  # rounds down to it
    "1.79769313486231581e308": False,  # past half-way to 2^1024: rounds to infinity
    # Half-way between the largest double and 2^1024 rounds to infinity; one less does not.
    HALF_WAY: False,
    str(int(HALF_WAY) - 1): True,
    "179769313486231570814527423731704356798070567525844996598917476803157260780028538760589558632766878171540458953514382464234321326889464182768467546703537516986049910576551282076245490090389328944075868508455133942304583236903222948165808559332123348274797826204144723168738177180919299881250404026184124858368": True,
    "1e-400": True,  # reads as 0.0
    "12345678901234567890123": True,  # past 64 bits, within a double
    "[" * 63 + "]" * 63: True,
    "[" * 64 + "]" * 64: False,
    '{"a": ' * 62 + "1" + "}" * 62: True,
    '{"a": ' * 63 + "[]" + "}" * 63: False,
    '{"text": "' + "9" * 400 + '"}': True,  # digits in a string are no number
}


@pytest.mark.parametrize("payload", list(PAYLOADS))
async def test_the_sql_function_refuses_exactly_what_the_api_refuses(
    client: httpx.AsyncClient, database_url: str, payload: str
) -> None:
    body = '{"queue": "q", "type": "t", "payload": ' + payload + "}"
    r = await client.post("/v1/jobs", content=body, headers={"content-type": "application/json"})
    api_takes = r.status_code == 201
    if not api_takes:
        assert r.status_code == 422, r.text
        assert r.json()["errors"][0]["field"].startswith("body"), r.text
    conn = await asyncpg.connect(database_url)
    try:
        try:
            await conn.fetchval("SELECT jobq.enqueue('q', 't', $1::jsonb)", payload)
            sql_takes = True
        except asyncpg.InvalidParameterValueError as refused:  # SQLSTATE 22023
            assert refused.column_name == "payload"
            sql_takes = False
    finally:
        await conn.close()
    assert (api_takes, sql_takes) == (PAYLOADS[payload],) * 2


UNREADABLE = {
    "number": ('{"n": 1e5000}', "payload"),
    "nesting": ("[" * 1200 + "]" * 1200, "payload"),
}


async def _insert_past_the_checks(engine: AsyncEngine, **columns: str) -> int:
    """A job written as an older version or a hand might have: straight into the table."""
    names = ", ".join(columns)
    values = ", ".join(f"CAST(:{n} AS jsonb)" for n in columns)
    async with engine.begin() as conn:
        job_id: int = (
            await conn.execute(
                text(
                    f"INSERT INTO jobs (queue, type, max_attempts, lease_seconds, {names}) "
                    f"VALUES ('q', 't', 5, 30, {values}) RETURNING id"
                ),
                columns,
            )
        ).scalar_one()
    return job_id


@pytest.mark.parametrize("case", list(UNREADABLE))
async def test_an_unreadable_job_fails_its_claim_alone_and_reads_with_its_error(
    client: httpx.AsyncClient, clean_db: AsyncEngine, case: str
) -> None:
    value, field = UNREADABLE[case]
    good_before = await enqueue(client, queue="q", payload={"i": 1})
    bad = await _insert_past_the_checks(clean_db, payload=value)
    bad_checkpoint = await _insert_past_the_checks(clean_db, checkpoint=value)
    good_after = await enqueue(client, queue="q", payload={"i": 2})

    claimed = await claim(client, queues=["q"], max_jobs=10)
    assert sorted(j["id"] for j in claimed) == [good_before["id"], good_after["id"]]
    assert [j["payload"] for j in sorted(claimed, key=lambda j: j["id"])] == [{"i": 1}, {"i": 2}]
    # Failed at once, not retried: no lease comes back to be claimed again.
    assert await claim(client, queues=["q"], max_jobs=10) == []

    for job_id, where in ((bad, field), (bad_checkpoint, "checkpoint")):
        r = await client.get(f"/v1/jobs/{job_id}")
        assert r.status_code == 200, r.text
        job: dict[str, Any] = r.json()
        assert job["status"] == "dead"
        assert job[where] is None
        assert set(job["stored_json_errors"]) == {where}
        assert "stored JSON no reader can take" in job["last_error"], job["last_error"]
        assert where in job["last_error"]

    listing = await client.get("/v1/jobs", params={"queue": "q", "limit": 10})
    assert listing.status_code == 200, listing.text
    rows = {j["id"]: j for j in listing.json()["jobs"]}
    assert set(rows) == {good_before["id"], bad, bad_checkpoint, good_after["id"]}
    assert rows[bad]["stored_json_errors"] == {field: rows[bad]["stored_json_errors"][field]}
    assert "stored_json_errors" not in rows[good_before["id"]]
    for page in (f"/dashboard/jobs/{bad}", "/dashboard/jobs?queue=q"):
        r = await client.get(page)
        assert r.status_code == 200, (page, r.status_code)
        assert "stored JSON no reader can take" in r.text


async def test_a_long_poll_that_claims_only_an_unreadable_job_waits_on(
    client: httpx.AsyncClient, clean_db: AsyncEngine
) -> None:
    bad = await _insert_past_the_checks(clean_db, payload='{"n": 1e5000}')
    r = await client.post(
        "/v1/claim", json={"worker_id": "w1", "queues": ["q"], "max_jobs": 1, "wait_seconds": 0}
    )
    assert r.status_code == 200 and r.json()["jobs"] == []
    assert (await client.get(f"/v1/jobs/{bad}")).json()["status"] == "dead"
