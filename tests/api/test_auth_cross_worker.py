"""A worker's identity comes from its key: another key holding the job id and lease id changes nothing."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.keys import Keys, as_key

TRANSITIONS = ["heartbeat", "complete", "fail", "release"]


async def _leased(client: httpx.AsyncClient, keys: Keys) -> dict[str, Any]:
    async with as_key(client, keys.producer) as producer:
        r = await producer.post("/v1/jobs", json={"queue": "emails", "type": "t"})
        assert r.status_code == 201
    async with as_key(client, keys.worker) as worker_a:
        body = {"worker_id": "host-a", "queues": ["emails"], "lease_seconds": 60}
        [job] = (await worker_a.post("/v1/claim", json=body)).json()["jobs"]
        # Worker A saves a checkpoint under its lease.
        lease = {"job_id": job["id"], "lease_id": job["lease_id"], "checkpoint": {"done": 1}}
        r = await worker_a.post("/v1/heartbeat", json={"worker_id": "host-a", "leases": [lease]})
        assert r.json()["results"][0]["ok"] is True
    return job


async def _row(client: httpx.AsyncClient, keys: Keys, job_id: int) -> dict[str, Any]:
    async with as_key(client, keys.admin) as admin:
        job: dict[str, Any] = (await admin.get(f"/v1/jobs/{job_id}")).json()
    return job


@pytest.mark.parametrize("transition", TRANSITIONS)
@pytest.mark.parametrize("thief", ["worker_b", "admin"])
async def test_another_key_with_the_same_worker_id_and_lease_is_lease_lost(
    client: httpx.AsyncClient, keys: Keys, transition: str, thief: str
) -> None:
    job = await _leased(client, keys)
    before = await _row(client, keys, job["id"])
    lease: dict[str, Any] = {"job_id": job["id"], "lease_id": job["lease_id"]}
    if transition != "complete":
        lease["checkpoint"] = {"done": 999}
    async with as_key(client, keys.by_role(thief)) as other:
        r = await other.post(f"/v1/{transition}", json={"worker_id": "host-a", "leases": [lease]})
    assert r.status_code == 200
    [result] = r.json()["results"]
    assert result["ok"] is False
    assert result["error"] == "lease_lost"
    after = await _row(client, keys, job["id"])
    assert after == before  # status, lease, checkpoint, attempts: all untouched

    # The rightful worker still holds its lease.
    async with as_key(client, keys.worker) as worker_a:
        mine = {"job_id": job["id"], "lease_id": job["lease_id"]}
        r = await worker_a.post("/v1/complete", json={"worker_id": "host-a", "leases": [mine]})
    assert r.json()["results"][0]["ok"] is True
    assert (await _row(client, keys, job["id"]))["status"] == "succeeded"


async def test_workers_of_two_keys_with_one_worker_id_are_two_workers(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    job = await _leased(client, keys)
    async with as_key(client, keys.producer) as producer:
        await producer.post("/v1/jobs", json={"queue": "emails", "type": "t"})
    async with as_key(client, keys.worker_b) as worker_b:
        body = {"worker_id": "host-a", "queues": ["emails"]}
        [other] = (await worker_b.post("/v1/claim", json=body)).json()["jobs"]
    async with as_key(client, keys.viewer) as viewer:
        workers = (await viewer.get("/v1/workers")).json()["workers"]
    assert sorted((w["worker_id"], w["key_name"], w["job_ids"]) for w in workers) == [
        ("host-a", "worker", [job["id"]]),
        ("host-a", "worker-b", [other["id"]]),
    ]
