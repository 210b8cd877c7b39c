"""Lease fencing with the real reaper of a running ``jobq serve``: a silent worker loses its job."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.acceptance.helpers import claim, job_rows, lease, lease_call
from tests.polling import poll_until
from tests.processes import JobqServers

pytestmark = pytest.mark.acceptance

QUEUE = "fencing"
ENV = {"JOBQ_REAPER_INTERVAL_SECONDS": "0.2"}
# Lease 1 s, reaper every 0.2 s, then a backoff of up to 1 s before the job is due again.
REAPED_TIMEOUT_SECONDS = 15.0


async def _enqueue_one(client: httpx.AsyncClient) -> dict[str, Any]:
    r = await client.post("/v1/jobs", json={"queue": QUEUE, "type": "fenced", "payload": {"x": 1}})
    assert r.status_code == 201, r.text
    job: dict[str, Any] = r.json()
    return job


async def _get(client: httpx.AsyncClient, job_id: int) -> dict[str, Any]:
    r = await client.get(f"/v1/jobs/{job_id}")
    assert r.status_code == 200, r.text
    job: dict[str, Any] = r.json()
    return job


def _assert_lease_lost(op: str, results: list[dict[str, Any]], job_id: int) -> None:
    [res] = results
    assert res["job_id"] == job_id, (op, res)
    assert res["ok"] is False, (op, res)
    assert res["error"] == "lease_lost", (op, res)
    assert res["cancelled"] is False, (op, res)


async def test_reaped_lease_is_fenced_and_the_new_holder_completes(
    jobq_servers: JobqServers, clean_db: AsyncEngine
) -> None:
    server = await jobq_servers.start(env=ENV)
    async with httpx.AsyncClient(base_url=server.url, timeout=10.0) as client:
        job = await _enqueue_one(client)

        [a] = await claim(client, "worker-A", QUEUE, lease_seconds=1)
        assert a["id"] == job["id"] and a["attempt"] == 1 and a["worker_id"] == "worker-A"
        # While A's lease runs, nobody else gets the job.
        assert await claim(client, "worker-B", QUEUE, lease_seconds=60) == []

        # A goes silent. B polls until the reaper has given the job back and B gets it.
        got: list[dict[str, Any]] = []

        async def b_got_it() -> bool:
            got.extend(await claim(client, "worker-B", QUEUE, lease_seconds=60))
            return bool(got)

        await poll_until(
            b_got_it, within=REAPED_TIMEOUT_SECONDS, what="worker B to claim the reaped job"
        )
        [b] = got
        assert b["id"] == job["id"], b
        assert b["worker_id"] == "worker-B" and b["attempt"] == 2 and b["status"] == "running"
        assert b["lease_id"] != a["lease_id"]

        # Every call A makes with its old lease is refused, and changes nothing.
        _assert_lease_lost(
            "heartbeat",
            await lease_call(client, "heartbeat", "worker-A", [lease(a, lease_seconds=600)]),
            job["id"],
        )
        _assert_lease_lost(
            "complete",
            await lease_call(client, "complete", "worker-A", [lease(a, result={"by": "A"})]),
            job["id"],
        )
        _assert_lease_lost(
            "fail",
            await lease_call(
                client, "fail", "worker-A", [lease(a, error="A failed", retryable=False)]
            ),
            job["id"],
        )
        _assert_lease_lost(
            "release",
            await lease_call(client, "release", "worker-A", [lease(a, checkpoint={"by": "A"})]),
            job["id"],
        )
        held = await _get(client, job["id"])
        assert held["status"] == "running" and held["worker_id"] == "worker-B", held
        assert held["lease_id"] == b["lease_id"] and held["attempts"] == 2, held
        assert held["lease_expires_at"] == b["lease_expires_at"], "A's heartbeat moved B's lease"
        assert held["checkpoint"] is None and held["last_error"] == "lease expired", held

        [done] = await lease_call(client, "complete", "worker-B", [lease(b, result={"by": "B"})])
        assert done["ok"] is True and done["status"] == "succeeded", done

        final = await _get(client, job["id"])
        assert final["status"] == "succeeded" and final["result"] == {"by": "B"}, final
        assert final["worker_id"] == "worker-B" and final["attempts"] == 2, final
        [expired] = final["errors"]
        assert expired["kind"] == "lease_expired" and expired["worker_id"] == "worker-A"
        assert expired["attempt"] == 1

    row = (await job_rows(clean_db))[job["id"]]
    assert row["status"] == "succeeded" and row["worker_id"] == "worker-B", row
    assert row["attempts"] == 2 and str(row["lease_id"]) == b["lease_id"], row


async def test_fail_and_release_after_reap_but_before_reclaim_are_lease_lost(
    jobq_servers: JobqServers, clean_db: AsyncEngine
) -> None:
    server = await jobq_servers.start(env=ENV)
    async with httpx.AsyncClient(base_url=server.url, timeout=10.0) as client:
        job = await _enqueue_one(client)
        [a] = await claim(client, "worker-A", QUEUE, lease_seconds=1)

        async def reaped() -> bool:
            return (await _get(client, job["id"]))["status"] != "running"

        await poll_until(reaped, within=REAPED_TIMEOUT_SECONDS, what="the reaper to take the job")
        assert (await _get(client, job["id"]))["last_error"] == "lease expired"

        fail = await lease_call(
            client, "fail", "worker-A", [lease(a, error="A gave up", retryable=False)]
        )
        release = await lease_call(client, "release", "worker-A", [lease(a)])
        after = await _get(client, job["id"])
        # A's non-retryable failure was not applied (the job is not dead, the error not kept) ...
        assert after["status"] in ("pending", "scheduled"), after
        assert after["last_error"] == "lease expired", after
        # ... so A must be told that it lost the lease, as heartbeat and complete tell it.
        _assert_lease_lost("fail", fail, job["id"])
        _assert_lease_lost("release", release, job["id"])
