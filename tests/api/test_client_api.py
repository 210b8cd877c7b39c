"""The Client against the real service: every producer and ops call, and problems as JobqError."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from jobq_client import JobqError
from tests.api.client_helpers import running_service


async def test_producer_and_query_calls_round_trip(
    database_url: str, clean_db: AsyncEngine
) -> None:
    async with running_service(database_url) as service, service.client() as client:
        job = await client.enqueue(
            "welcome",
            {"user": 42},
            queue="emails",
            priority=5,
            max_attempts=3,
            lease_seconds=90,
            timeout_seconds=600,
            idempotency_key="welcome-42",
        )
        assert job["status"] == "pending" and job["payload"] == {"user": 42}
        assert (job["priority"], job["max_attempts"], job["lease_seconds"]) == (5, 3, 90)
        assert job["timeout_seconds"] == 600 and job["idempotency_key"] == "welcome-42"
        replay = await client.enqueue(
            "welcome",
            {"user": 42},
            queue="emails",
            priority=5,
            max_attempts=3,
            lease_seconds=90,
            timeout_seconds=600,
            idempotency_key="welcome-42",
        )
        assert replay["id"] == job["id"]
        with pytest.raises(JobqError) as reused:
            await client.enqueue(
                "welcome", {"user": 43}, queue="emails", idempotency_key="welcome-42"
            )
        assert reused.value.status == 422

        later = await client.enqueue(
            "t", queue="emails", run_at=datetime.now(UTC) + timedelta(hours=1)
        )
        assert later["status"] == "scheduled"
        delayed = await client.enqueue("t", queue="emails", delay_seconds=3600)
        assert delayed["status"] == "scheduled"
        batch = await client.enqueue_batch(
            [{"type": "b", "queue": "other", "payload": n} for n in range(3)]
        )
        assert [j["payload"] for j in batch] == [0, 1, 2]

        assert (await client.get_job(job["id"]))["id"] == job["id"]
        first = await client.list_jobs(queue="emails", limit=2)
        rest = await client.list_jobs(queue="emails", limit=2, after=first["next_cursor"])
        listed = [j["id"] for j in first["jobs"] + rest["jobs"]]
        assert listed == sorted([job["id"], later["id"], delayed["id"]], reverse=True)
        scheduled = await client.list_jobs(status="scheduled", type="t")
        assert {j["id"] for j in scheduled["jobs"]} == {later["id"], delayed["id"]}

        assert (await client.cancel(delayed["id"]))["status"] == "cancelled"
        assert (await client.retry(delayed["id"]))["status"] in {"pending", "scheduled"}
        with pytest.raises(JobqError) as conflict:
            await client.retry(job["id"])
        assert conflict.value.status == 409 and conflict.value.title == "Conflict"


async def test_error_answers_raise_jobq_error_with_the_services_problem(
    database_url: str, clean_db: AsyncEngine
) -> None:
    async with running_service(database_url) as service, service.client() as client:
        with pytest.raises(JobqError) as missing:
            await client.get_job(999_999)
        assert missing.value.status == 404 and missing.value.problem["status"] == 404
        with pytest.raises(JobqError) as invalid:
            await client.enqueue("t", queue="not a queue name")
        assert invalid.value.status == 422
        assert [e["field"] for e in invalid.value.errors] == ["body.queue"]
        assert "body.queue" in str(invalid.value)
        with pytest.raises(JobqError) as bad_claim:
            await client.claim("w", [], max_jobs=1)
        assert bad_claim.value.status == 422


async def test_a_batch_answered_by_ids_names_each_job_and_whether_this_call_made_it(
    database_url: str, clean_db: AsyncEngine
) -> None:
    async with running_service(database_url) as service, service.client() as client:
        first = await client.enqueue_batch_ids(
            [
                {"type": "t", "payload": 1, "queue": "lean", "idempotency_key": "lean-1"},
                {"type": "t", "payload": 2, "queue": "lean"},
            ],
            callback={"type": "after", "queue": "lean"},
        )
        again = await client.enqueue_batch_ids(
            [
                {"type": "t", "payload": 1, "queue": "lean", "idempotency_key": "lean-1"},
                {"type": "t", "payload": 3, "queue": "lean"},
            ]
        )
        jobs = [await client.get_job(job_id) for job_id in first["ids"]]
        callback = await client.get_job(first["callback_id"])
        with pytest.raises(JobqError) as refused:
            await client._call(
                "POST",
                "/v1/jobs/batch",
                params={"answer": "all"},
                json={"jobs": [{"type": "t", "queue": "lean"}]},
            )

    assert set(first) == {"ids", "created", "callback_id"}
    assert [job["payload"] for job in jobs] == [1, 2] and first["created"] == [True, True]
    assert callback["type"] == "after" and callback["depends_on"] == first["ids"]
    assert again["ids"][0] == first["ids"][0] and again["created"] == [False, True]
    assert again["callback_id"] is None and again["ids"][1] not in first["ids"]
    assert refused.value.status == 422
    assert [e["field"] for e in refused.value.errors] == ["query.answer"], refused.value.problem
