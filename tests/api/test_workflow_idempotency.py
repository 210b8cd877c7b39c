"""A workflow create takes an idempotency key, as an enqueue does (issue 40, item 6).

201 when created; 200 with the same workflow when the same key comes with the same request; 422
naming the field when the key comes with a different one. Concurrent creates with one key make
one workflow: the test holds the table's lock until every create waits on it, so all of them
reach their insert together.
"""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import httpx
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.locks import lock_waiters
from tests.polling import poll_until

FLOW: dict[str, Any] = {
    "name": "nightly",
    "steps": [
        {"name": "extract", "queue": "etl", "type": "extract", "payload": {"day": 7}},
        {"name": "load", "queue": "etl", "type": "load", "after": ["extract"]},
    ],
}


def _keyed(key: str, **changes: Any) -> dict[str, Any]:
    body = copy.deepcopy(FLOW)
    body.update(changes)
    body["idempotency_key"] = key
    return body


async def _counts(engine: AsyncEngine) -> tuple[int, int]:
    async with engine.connect() as conn:
        workflows = await conn.scalar(text("SELECT count(*) FROM workflows"))
        jobs = await conn.scalar(text("SELECT count(*) FROM jobs"))
    return int(workflows or 0), int(jobs or 0)


def _problem_fields(response: httpx.Response) -> list[str]:
    assert response.status_code == 422, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    return [e["field"] for e in response.json()["errors"]]


async def test_a_replay_answers_the_same_workflow_with_200(
    client: httpx.AsyncClient, clean_db: AsyncEngine
) -> None:
    first = await client.post("/v1/workflows", json=_keyed("nightly-2026-12-07"))
    assert first.status_code == 201, first.text
    again = await client.post("/v1/workflows", json=_keyed("nightly-2026-12-07"))
    assert again.status_code == 200, again.text
    assert again.json()["id"] == first.json()["id"]
    assert [s["job"]["id"] for s in again.json()["steps"]] == [
        s["job"]["id"] for s in first.json()["steps"]
    ]
    assert await _counts(clean_db) == (1, 2)
    # The header is the same key.
    header = await client.post(
        "/v1/workflows", json=FLOW, headers={"Idempotency-Key": "nightly-2026-12-07"}
    )
    assert header.status_code == 200 and header.json()["id"] == first.json()["id"]
    # Another key is another workflow.
    other = await client.post("/v1/workflows", json=_keyed("nightly-2026-12-08"))
    assert other.status_code == 201 and other.json()["id"] != first.json()["id"]
    assert await _counts(clean_db) == (2, 4)


async def test_a_key_reused_with_another_request_is_refused_naming_the_field(
    client: httpx.AsyncClient, clean_db: AsyncEngine
) -> None:
    assert (await client.post("/v1/workflows", json=_keyed("k1"))).status_code == 201
    changed = _keyed("k1")
    changed["steps"][0]["payload"] = {"day": 8}
    for body in (changed, _keyed("k1", name="other")):
        r = await client.post("/v1/workflows", json=body)
        assert _problem_fields(r) == ["body.idempotency_key"]
        assert r.json()["type"].endswith("idempotency-key-reused")
    r = await client.post(
        "/v1/workflows", json={**FLOW, "name": "x"}, headers={"Idempotency-Key": "k1"}
    )
    assert _problem_fields(r) == ["header.Idempotency-Key"]
    assert await _counts(clean_db) == (1, 2)


async def test_the_header_and_the_body_must_agree(
    client: httpx.AsyncClient, clean_db: AsyncEngine
) -> None:
    r = await client.post("/v1/workflows", json=_keyed("a"), headers={"Idempotency-Key": "b"})
    assert _problem_fields(r) == ["header.Idempotency-Key"]
    r = await client.post("/v1/workflows", json=_keyed(""))
    assert _problem_fields(r) == ["body.idempotency_key"]
    assert await _counts(clean_db) == (0, 0)


async def test_concurrent_creates_with_one_key_make_one_workflow(
    client: httpx.AsyncClient, clean_db: AsyncEngine
) -> None:
    creates = 6
    async with clean_db.connect() as holder:
        # Every create waits at its first write until all of them do: none can see another's
        # workflow before inserting its own.
        transaction = await holder.begin()
        await holder.execute(text("LOCK TABLE workflows IN SHARE ROW EXCLUSIVE MODE"))
        sent = [
            asyncio.create_task(client.post("/v1/workflows", json=_keyed("once")))
            for _ in range(creates)
        ]

        async def all_waiting() -> bool:
            # (All answered already: refused without waiting, which the asserts below report.)
            return all(t.done() for t in sent) or await lock_waiters(clean_db) >= creates

        await poll_until(all_waiting, within=20, what=f"{creates} creates waiting on the lock")
        await transaction.rollback()
        answers = await asyncio.gather(*sent)
    assert sorted(r.status_code for r in answers) == [200] * (creates - 1) + [201], [
        r.text for r in answers
    ]
    assert len({r.json()["id"] for r in answers}) == 1
    assert await _counts(clean_db) == (1, 2)
