"""Failures grouped by cause (GET /v1/failures) and acted on per group (POST /v1/failures/...).

Issue 20: why jobs fail could not be found. Failures are grouped by queue, job type, error type
and cause; a group can be retried or cancelled on exactly the jobs it holds. Issue 40 (item 10):
the cause was the message with only whole-word numbers masked, which split one cause into a
group per payment id or mailbox; it is now the traceback's frames when the failure has one,
else the message with every token holding a digit or a quoted value masked
(tests/failure_scene.py: twelve causes, twelve groups).
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.domain.fingerprints import failure_fingerprint
from tests.api.helpers import claim, enqueue, get_job, lease, lease_call
from tests.failure_scene import CAUSES, JOBS_PER_CAUSE, fail_scene, user_missing_in_sync
from tests.keys import Keys, bearer


async def fail_one(
    client: httpx.AsyncClient, queue: str, job_type: str, error: Any, **fields: Any
) -> dict[str, Any]:
    job = await enqueue(client, queue=queue, type=job_type, **fields)
    [held] = await claim(client, "w1", [queue])
    assert held["id"] == job["id"]
    # A retry an hour away: a retrying job must not come back into a later claim of the test.
    [result] = await lease_call(
        client, "fail", "w1", lease(held, error=error, retry_after_seconds=3600)
    )
    assert result["ok"], result
    return job


async def groups(client: httpx.AsyncClient, **params: Any) -> list[dict[str, Any]]:
    r = await client.get("/v1/failures", params=params)
    assert r.status_code == 200, r.text
    found: list[dict[str, Any]] = r.json()["groups"]
    return found


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ("order 17 not found", "order 18 not found"),
        ("user 'alice' is locked", "user 'bob' is locked"),
        ('no key "currency" in row', 'no key "amount" in row'),
        (
            "upload 1b4e28ba-2fa1-11d2-883f-0016d3cca427 failed",
            "upload 6fa459ea-ee8a-3ca4-894e-db77e160355e failed",
        ),
        ("object at 0x7f3a9c2b1d90 gone", "object at 0x7f3a9c2b1e20 gone"),
        ("sha deadbeef12345678 mismatch", "sha 0123456789abcdef mismatch"),
        ("took 1.5 s, limit 1", "took 20.25 s, limit 1"),
    ],
)
async def test_messages_differing_only_in_values_fall_in_one_group(
    client: httpx.AsyncClient, clean_db: AsyncEngine, first: str, second: str
) -> None:
    for message in (first, second):
        await fail_one(client, "q", "sync", {"type": "LookupError", "message": message})
    [group] = await groups(client)
    assert group["failures"] == 2 and group["jobs"] == 2
    assert group["error_type"] == "LookupError"
    assert group["last_message"] == second
    for value in ("17", "alice", "currency", "1b4e28ba", "0x7f3a", "deadbeef", "1.5"):
        assert value not in group["pattern"]


async def test_different_causes_queues_and_types_are_told_apart(
    client: httpx.AsyncClient, clean_db: AsyncEngine
) -> None:
    await fail_one(client, "a", "sync", {"type": "KeyError", "message": "'currency'"})
    await fail_one(client, "a", "sync", {"type": "KeyError", "message": "'amount'"})
    await fail_one(client, "a", "sync", {"type": "ValueError", "message": "bad 1"})
    await fail_one(client, "a", "mail", {"type": "KeyError", "message": "'x'"})
    await fail_one(client, "b", "sync", {"type": "KeyError", "message": "'x'"})
    await fail_one(client, "a", "sync", "plain text error 42")
    found = await groups(client)
    summary = {(g["queue"], g["type"], g["error_type"], g["pattern"]): g["failures"] for g in found}
    assert summary == {
        ("a", "sync", "KeyError", "'?'"): 2,
        ("a", "sync", "ValueError", "bad <n>"): 1,
        ("a", "mail", "KeyError", "'?'"): 1,
        ("b", "sync", "KeyError", "'?'"): 1,
        ("a", "sync", "failed", "plain text error <n>"): 1,
    }
    assert found[0]["failures"] == 2  # the largest group first
    only_b = await groups(client, queue="b")
    assert [(g["queue"], g["failures"]) for g in only_b] == [("b", 1)]
    job = await get_job(client, found[0]["sample_job_ids"][0])
    assert job["last_error"].startswith("KeyError: '")


async def test_a_group_is_retried_on_exactly_its_dead_jobs(
    client: httpx.AsyncClient, clean_db: AsyncEngine
) -> None:
    error = {"type": "TimeoutError", "message": "host 10.0.0.7 did not answer"}
    dead = [await fail_one(client, "q", "sync", error, max_attempts=1) for _ in range(3)]
    retrying = await fail_one(client, "q", "sync", error, max_attempts=5)
    other = await fail_one(
        client, "q", "sync", {"type": "KeyError", "message": "'x'"}, max_attempts=1
    )
    [group] = [g for g in await groups(client) if g["error_type"] == "TimeoutError"]
    assert group["dead_jobs"] == 3 and group["jobs"] == 4
    key = {k: group[k] for k in ("queue", "type", "error_type", "fingerprint")}

    preview = await client.post("/v1/failures/retry", json={**key, "dry_run": True})
    assert preview.json() == {"action": "retry", "dry_run": True, "changed": 3, "batches": 0}
    done = await client.post("/v1/failures/retry", json=key)
    assert done.status_code == 200, done.text
    assert done.json()["changed"] == 3
    for job in dead:
        assert (await get_job(client, job["id"]))["status"] == "pending"
    assert (await get_job(client, retrying["id"]))["status"] == "scheduled"
    assert (await get_job(client, other["id"]))["status"] == "dead"

    cancelled = await client.post("/v1/failures/cancel", json=key)
    # Cancel takes the group's jobs waiting to retry (and the pending ones it just retried).
    assert cancelled.json()["changed"] == 4
    assert (await get_job(client, retrying["id"]))["status"] == "cancelled"
    bulk_audit = (await client.get("/v1/audit", params={"action": "bulk.retry"})).json()
    assert bulk_audit["entries"][0]["detail"]["jobs"] == 3


async def test_failures_respect_key_scopes(
    client: httpx.AsyncClient, clean_db: AsyncEngine, keys: Keys
) -> None:
    for queue in ("billing.eu", "mail"):
        job = await client.post(
            "/v1/jobs", json={"queue": queue, "type": "t"}, headers=bearer(keys.admin)
        )
        assert job.status_code == 201
        held = await client.post(
            "/v1/claim",
            json={"worker_id": "w", "queues": [queue]},
            headers=bearer(keys.worker),
        )
        [claimed] = held.json()["jobs"]
        await client.post(
            "/v1/fail",
            json={"worker_id": "w", "leases": [lease(claimed, error="x")]},
            headers=bearer(keys.worker),
        )
    scoped = await client.get("/v1/failures", headers=bearer(keys.scoped_viewer))
    assert [g["queue"] for g in scoped.json()["groups"]] == ["billing.eu"]
    outside = await client.get(
        "/v1/failures", params={"queue": "mail"}, headers=bearer(keys.scoped_viewer)
    )
    assert outside.status_code == 403
    act = await client.post(
        "/v1/failures/retry",
        json={
            "queue": "mail",
            "type": "t",
            "error_type": "failed",
            "fingerprint": "m:" + "0" * 32,
        },
        headers=bearer(keys.scoped_admin),
    )
    assert act.status_code == 403
    assert "body.queue" in act.text


async def test_a_structured_error_is_bounded_and_checked(
    client: httpx.AsyncClient, clean_db: AsyncEngine
) -> None:
    job = await enqueue(client, queue="q")
    [held] = await claim(client, "w1", ["q"])
    too_long = {"type": "E" * 201, "message": "m"}
    r = await client.post(
        "/v1/fail", json={"worker_id": "w1", "leases": [lease(held, error=too_long)]}
    )
    assert r.status_code == 422
    assert "type" in r.text
    unknown = await client.post(
        "/v1/fail",
        json={"worker_id": "w1", "leases": [lease(held, error={"type": "E", "stack": "s"})]},
    )
    assert unknown.status_code == 422
    traceback = "Traceback (most recent call last):\n" + "  frame\n" * 5000 + "ValueError: last"
    [result] = await lease_call(
        client,
        "fail",
        "w1",
        lease(held, error={"type": "ValueError", "message": "last", "traceback": traceback}),
    )
    assert result["ok"]
    events = (await client.get(f"/v1/jobs/{job['id']}/events")).json()["events"]
    kept = events[-1]["data"]["traceback"]
    assert len(kept) == 16_000 and kept.endswith("ValueError: last")
    stored = await get_job(client, job["id"])
    assert stored["last_error"] == "ValueError: last"
    assert stored["errors"][-1]["type"] == "ValueError"
    assert "traceback" not in stored["errors"][-1]


async def test_jobs_are_found_by_error_text_and_acted_on_by_id(
    client: httpx.AsyncClient, clean_db: AsyncEngine
) -> None:
    a = await fail_one(client, "q", "t", "SMTP 451 try later", max_attempts=1)
    b = await fail_one(client, "q", "t", "disk full", max_attempts=1)
    c = await fail_one(client, "q", "t", "smtp 550 no such user", max_attempts=1)
    r = await client.get("/v1/jobs", params={"error": "SMTP", "queue": "q"})
    assert [j["id"] for j in r.json()["jobs"]] == [c["id"], a["id"]]
    literal = await client.get("/v1/jobs", params={"error": "100%_"})
    assert literal.json()["jobs"] == []
    picked = await client.post("/v1/jobs/bulk/retry", json={"ids": [a["id"], b["id"]]})
    assert picked.json()["changed"] == 2
    assert (await get_job(client, c["id"]))["status"] == "dead"
    empty = await client.post("/v1/jobs/bulk/retry", json={"ids": []})
    assert empty.status_code == 422


async def test_a_realistic_scene_shows_one_group_per_cause(
    client: httpx.AsyncClient, clean_db: AsyncEngine
) -> None:
    """Issue 40: 900 jobs failing from twelve causes, each with ids, addresses, paths and hosts
    of its own, showed hundreds of groups; grouped by traceback frames (or the message with
    every token holding a digit or a quoted value masked) they show twelve."""
    ids = await fail_scene(client)
    found = await groups(client, limit=200)
    assert len(found) == len(CAUSES), [(g["error_type"], g["pattern"]) for g in found]
    by_cause: dict[str, dict[str, Any]] = {}
    for group in found:
        [cause] = [name for name, members in ids.items() if group["sample_job_ids"][0] in members]
        assert set(group["sample_job_ids"]) <= set(ids[cause]), cause
        assert group["failures"] == group["jobs"] == group["dead_jobs"] == JOBS_PER_CAUSE, cause
        by_cause[cause] = group
    assert set(by_cause) == {cause.name for cause in CAUSES}
    assert len({(g["queue"], g["type"], g["error_type"], g["fingerprint"]) for g in found}) == 12

    # The same KeyError messages from two code paths, in one queue and job type: two groups,
    # told apart by where they were raised.
    sync, invoice = by_cause["user missing (sync)"], by_cause["user missing (invoice)"]
    assert sync["pattern"] == invoice["pattern"] == "'?'"
    assert sync["grouped_by"] == invoice["grouped_by"] == "traceback"
    assert sync["fingerprint"] != invoice["fingerprint"]
    assert sync["culprit"] == "sync/users.py in pull_user"
    assert invoice["culprit"] == "billing/invoices.py in build_invoice"
    # The same message and frames as two exception types: two groups.
    invalid, mistyped = by_cause["amount invalid"], by_cause["amount mistyped"]
    assert (invalid["error_type"], mistyped["error_type"]) == ("ValueError", "TypeError")
    assert invalid["fingerprint"] == mistyped["fingerprint"]
    assert invalid["pattern"] == "invalid amount <n> for currency '?' in row <n>"

    # A readable pattern and the newest message unmasked, whatever grouped them.
    patterns = {name: group["pattern"] for name, group in by_cause.items()}
    assert patterns["card declined"] == (
        "Charge <id> declined for customer <id>: insufficient_funds (request <id>)"
    )
    assert patterns["duplicate order"] == (
        'duplicate key value violates unique constraint "?"\n'
        "DETAIL:  Key (id)=(<n>) already exists."
    )
    assert patterns["cache refused"] == "connect ECONNREFUSED <n>:<n>"
    assert patterns["ledger refused"] == "dial tcp <n>:<n>: connect: connection refused"
    assert by_cause["ledger refused"]["culprit"] == "ledger/store.go in main.(*Store).Connect"
    assert by_cause["cache refused"]["culprit"] == "dist/cache.js in RedisCache.get"
    for name in ("report missing", "upstream timeout"):
        assert by_cause[name]["grouped_by"] == "message" and by_cause[name]["culprit"] is None
    assert patterns["report missing"] == (
        "open /var/data/exports/<id>/<id>: no such file or directory"
    )
    assert patterns["upstream timeout"] == "upstream timeout after <id> (request <id>)"
    newest = by_cause["card declined"]
    assert newest["last_message"].startswith("Charge ch_3c")

    # Retrying a group retries exactly its jobs: not the other code path's KeyErrors.
    key = {k: sync[k] for k in ("queue", "type", "error_type", "fingerprint")}
    preview = await client.post("/v1/failures/retry", json={**key, "dry_run": True})
    assert preview.status_code == 200, preview.text
    assert preview.json()["changed"] == JOBS_PER_CAUSE
    done = await client.post("/v1/failures/retry", json=key)
    assert done.json()["changed"] == JOBS_PER_CAUSE
    for job_id in ids["user missing (sync)"][:3] + ids["user missing (invoice)"][:3]:
        expected = "pending" if job_id in ids["user missing (sync)"] else "dead"
        assert (await get_job(client, job_id))["status"] == expected


async def test_failures_recorded_without_a_fingerprint_group_by_their_message(
    client: httpx.AsyncClient, clean_db: AsyncEngine
) -> None:
    """Failure events written before fingerprints (before the upgrade, or by the previous
    release during a rolling deploy) carry none: they group by their masked message, one group
    per message shape, and their group's key acts on them."""
    ids = await fail_scene(client, jobs_per_cause=6)
    async with clean_db.begin() as conn:
        await conn.execute(
            text("UPDATE job_events SET data = data - 'fingerprint' WHERE kind = 'failed'")
        )
    found = await groups(client, limit=200)
    # The two code paths' KeyErrors have one message shape: one group, as before fingerprints.
    assert len(found) == len(CAUSES) - 1
    assert all(g["grouped_by"] == "message" for g in found)
    assert all(g["fingerprint"].startswith("m:") for g in found)
    [key_errors] = [g for g in found if g["error_type"] == "KeyError"]
    assert key_errors["jobs"] == 12 and key_errors["pattern"] == "'?'"
    assert key_errors["culprit"] in (
        "sync/users.py in pull_user",
        "billing/invoices.py in build_invoice",
    )
    key = {k: key_errors[k] for k in ("queue", "type", "error_type", "fingerprint")}
    done = await client.post("/v1/failures/retry", json=key)
    assert done.status_code == 200, done.text
    assert done.json()["changed"] == 12
    both = ids["user missing (sync)"] + ids["user missing (invoice)"]
    assert {(await get_job(client, i))["status"] for i in both} == {"pending"}


async def test_the_fingerprint_is_stored_with_the_failure_and_a_group_key_is_checked(
    client: httpx.AsyncClient, clean_db: AsyncEngine
) -> None:
    error = user_missing_in_sync(0)
    job = await fail_one(client, "q", "sync", error)
    events = (await client.get(f"/v1/jobs/{job['id']}/events")).json()["events"]
    data = events[-1]["data"]
    # Recomputable from the kept traceback: what a later grouping rule could start from.
    assert data["fingerprint"] == failure_fingerprint(data["traceback"]) is not None
    plain = await fail_one(client, "q", "sync", {"type": "KeyError", "message": "'x'"})
    events = (await client.get(f"/v1/jobs/{plain['id']}/events")).json()["events"]
    assert "fingerprint" not in events[-1]["data"]

    base = {"queue": "q", "type": "sync", "error_type": "KeyError"}
    for wrong in ("'?'", "t:" + "0" * 31, "x:" + "0" * 32, "T:" + "A" * 32):
        r = await client.post("/v1/failures/retry", json={**base, "fingerprint": wrong})
        assert r.status_code == 422, wrong
        assert "body.fingerprint" in r.text
    # The previous release's key (pattern) is refused by name, not taken for another group.
    r = await client.post("/v1/failures/retry", json={**base, "pattern": "'?'"})
    assert r.status_code == 422
    assert "body.pattern" in r.text and "body.fingerprint" in r.text
