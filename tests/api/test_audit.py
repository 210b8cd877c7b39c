"""The audit trail: every admin action recorded once, by its own statement, and GET /v1/audit."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.auth import store
from app.auth.keys import Role
from tests.api.helpers import claim, enqueue, lease, lease_call
from tests.keys import Keys, as_key, make_key
from tests.processes import clean_environment

COLUMNS = (
    "actor, actor_key_id, action, outcome, queue, job_id, key_name, state_before, state_after, "
    "detail"
)


@pytest.fixture(autouse=True)
async def no_audit(clean_db: AsyncEngine) -> None:
    """Starts each test with an empty trail (clean_db does not truncate it)."""
    await forget(clean_db)


async def forget(engine: AsyncEngine) -> None:
    async with engine.begin() as conn:
        await conn.execute(text("TRUNCATE audit_log RESTART IDENTITY"))


async def rows(engine: AsyncEngine) -> list[dict[str, Any]]:
    async with engine.connect() as conn:
        result = await conn.execute(text(f"SELECT {COLUMNS} FROM audit_log ORDER BY id"))
        return [dict(r) for r in result.mappings()]


def entry(**fields: Any) -> dict[str, Any]:
    """An audit row with every column not named empty."""
    base: dict[str, Any] = {c.strip(): None for c in COLUMNS.split(",")}
    return {**base, **fields}


# -- each action writes one row ---------------------------------------------------------------


async def test_a_cancel_writes_one_row_with_the_caller_and_the_change(
    client: httpx.AsyncClient, clean_db: AsyncEngine
) -> None:
    job = await enqueue(client, queue="mail")
    r = await client.post(f"/v1/jobs/{job['id']}/cancel")
    assert r.status_code == 200
    assert await rows(clean_db) == [
        entry(
            actor="anonymous",  # authentication is off
            action="job.cancel",
            outcome="changed",
            queue="mail",
            job_id=job["id"],
            state_before="pending",
            state_after="cancelled",
        )
    ]
    # Written by the cancel's own statement: one now() for both.
    async with clean_db.connect() as conn:
        same = (
            await conn.execute(
                text("SELECT a.at = j.finished_at FROM audit_log a JOIN jobs j ON j.id = a.job_id")
            )
        ).scalar_one()
    assert same is True


async def test_cancelling_a_running_job_records_running_before(
    client: httpx.AsyncClient, clean_db: AsyncEngine
) -> None:
    await enqueue(client)
    [held] = await claim(client)
    assert (await client.post(f"/v1/jobs/{held['id']}/cancel")).status_code == 200
    [row] = await rows(clean_db)
    assert (row["state_before"], row["state_after"]) == ("running", "cancelled")


async def test_a_repeated_cancel_is_recorded_as_unchanged(
    client: httpx.AsyncClient, clean_db: AsyncEngine
) -> None:
    job = await enqueue(client)
    await client.post(f"/v1/jobs/{job['id']}/cancel")
    r = await client.post(f"/v1/jobs/{job['id']}/cancel")
    assert r.status_code == 200
    assert [(r["outcome"], r["state_before"], r["state_after"]) for r in await rows(clean_db)] == [
        ("changed", "pending", "cancelled"),
        ("unchanged", "cancelled", "cancelled"),
    ]


async def test_refused_cancels_and_retries_write_nothing(
    client: httpx.AsyncClient, clean_db: AsyncEngine
) -> None:
    await enqueue(client)
    [held] = await claim(client)
    await lease_call(client, "complete", "w1", lease(held))
    assert (await client.post(f"/v1/jobs/{held['id']}/cancel")).status_code == 409
    pending = await enqueue(client)
    assert (await client.post(f"/v1/jobs/{pending['id']}/retry")).status_code == 409
    assert (await client.post("/v1/jobs/999999/cancel")).status_code == 404
    assert (await client.post("/v1/jobs/999999/retry")).status_code == 404
    assert await rows(clean_db) == []


async def test_a_retry_writes_one_row(client: httpx.AsyncClient, clean_db: AsyncEngine) -> None:
    job = await enqueue(client, queue="mail")
    await client.post(f"/v1/jobs/{job['id']}/cancel")
    await forget(clean_db)
    assert (await client.post(f"/v1/jobs/{job['id']}/retry")).status_code == 200
    assert await rows(clean_db) == [
        entry(
            actor="anonymous",
            action="job.retry",
            outcome="changed",
            queue="mail",
            job_id=job["id"],
            state_before="cancelled",
            state_after="pending",
        )
    ]


async def test_pause_and_resume_name_the_admin_key_and_the_queue(
    client: httpx.AsyncClient, keys: Keys, clean_db: AsyncEngine
) -> None:
    await forget(clean_db)  # the keys fixture's own key.create rows
    async with as_key(client, keys.admin) as admin:
        await enqueue(admin, queue="mail")  # a queue exists to be paused; enqueues are not audited
        assert (await admin.post("/v1/queues/mail/pause")).status_code == 200
        assert (await admin.post("/v1/queues/mail/pause")).status_code == 200
        assert (await admin.post("/v1/queues/mail/resume")).status_code == 200
    recorded = await rows(clean_db)
    assert {r["actor"] for r in recorded} == {"admin"}
    assert len({r["actor_key_id"] for r in recorded}) == 1 and recorded[0]["actor_key_id"]
    assert [
        (r["action"], r["outcome"], r["queue"], r["state_before"], r["state_after"])
        for r in recorded
    ] == [
        ("queue.pause", "changed", "mail", "active", "paused"),
        ("queue.pause", "unchanged", "mail", "paused", "paused"),
        ("queue.resume", "changed", "mail", "paused", "active"),
    ]
    async with clean_db.connect() as conn:
        same = (
            await conn.execute(
                text(
                    "SELECT a.at = q.updated_at FROM audit_log a JOIN queues q ON q.name = a.queue "
                    "ORDER BY a.id DESC LIMIT 1"
                )
            )
        ).scalar_one()
    assert same is True


async def test_a_refused_pause_of_a_scoped_admin_writes_nothing(
    client: httpx.AsyncClient, keys: Keys, clean_db: AsyncEngine
) -> None:
    await forget(clean_db)
    async with as_key(client, keys.scoped_admin) as scoped:
        assert (await scoped.post("/v1/queues/emails/pause")).status_code == 403
    async with as_key(client, keys.viewer) as viewer:
        assert (await viewer.post("/v1/queues/emails/pause")).status_code == 403
    assert await rows(clean_db) == []


async def test_key_create_and_revoke_are_recorded_in_their_transaction(
    clean_db: AsyncEngine,
) -> None:
    await make_key(clean_db, "mailer", Role.WORKER, ["emails"])
    async with clean_db.begin() as conn:
        assert await store.revoke_key(conn, name="mailer", actor="ops")
        assert not await store.revoke_key(conn, name="nobody", actor="ops")
    async with clean_db.connect() as conn:
        await store.create_key(conn, name="gone", role=Role.ADMIN, queues=None, actor="ops")
        await conn.rollback()  # a create that does not commit leaves no trace
    assert await rows(clean_db) == [
        entry(
            actor="internal",
            action="key.create",
            outcome="changed",
            key_name="mailer",
            state_after="live",
            detail={"role": "worker", "queues": ["emails"]},
        ),
        entry(
            actor="ops",
            action="key.revoke",
            outcome="changed",
            key_name="mailer",
            state_before="live",
            state_after="revoked",
        ),
        entry(actor="ops", action="key.revoke", outcome="refused", key_name="nobody"),
    ]


def jobq_keys(database_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = clean_environment({"DATABASE_URL": database_url, "LOGNAME": "alice", "USER": "alice"})
    return subprocess.run(
        [sys.executable, "-m", "app.cli", "keys", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


async def test_the_cli_records_its_key_operations_as_cli_and_the_os_user(
    database_url: str, clean_db: AsyncEngine
) -> None:
    assert jobq_keys(database_url, "create", "--role", "viewer", "--name", "dash").returncode == 0
    assert jobq_keys(database_url, "create", "--role", "admin", "--name", "dash").returncode == 1
    assert jobq_keys(database_url, "revoke", "dash").returncode == 0
    assert jobq_keys(database_url, "revoke", "dash").returncode == 1
    assert jobq_keys(database_url, "list").returncode == 0  # a read: not recorded
    assert [
        (r["actor"], r["action"], r["outcome"], r["key_name"], r["detail"])
        for r in await rows(clean_db)
    ] == [
        ("cli:alice", "key.create", "changed", "dash", {"role": "viewer", "queues": None}),
        ("cli:alice", "key.create", "refused", "dash", {"role": "admin", "queues": None}),
        ("cli:alice", "key.revoke", "changed", "dash", None),
        ("cli:alice", "key.revoke", "refused", "dash", None),
    ]


# -- GET /v1/audit ----------------------------------------------------------------------------


async def _pause_resume(client: httpx.AsyncClient, queue: str, times: int) -> None:
    await enqueue(client, queue=queue)  # only a queue that exists can be paused
    for _ in range(times):
        assert (await client.post(f"/v1/queues/{queue}/pause")).status_code == 200
        assert (await client.post(f"/v1/queues/{queue}/resume")).status_code == 200


async def test_the_listing_pages_newest_first_with_a_cursor(client: httpx.AsyncClient) -> None:
    await _pause_resume(client, "q", 3)  # six entries
    seen: list[dict[str, Any]] = []
    after: str | None = None
    pages = 0
    while True:
        params: dict[str, Any] = {"limit": 4}
        if after is not None:
            params["after"] = after
        r = await client.get("/v1/audit", params=params)
        assert r.status_code == 200, r.text
        page = r.json()
        seen += page["entries"]
        pages += 1
        after = page["next_cursor"]
        if after is None:
            break
    assert pages == 2
    ids = [e["id"] for e in seen]
    assert ids == sorted(ids, reverse=True) and len(set(ids)) == 6
    assert [e["action"] for e in seen[:2]] == ["queue.resume", "queue.pause"]
    first = seen[0]
    assert set(first) == {
        "id",
        "at",
        "actor",
        "action",
        "outcome",
        "queue",
        "job_id",
        "key_name",
        "state_before",
        "state_after",
        "detail",
    }
    assert first["actor"] == "anonymous" and first["queue"] == "q"


async def test_the_listing_filters_by_action_and_actor(
    client: httpx.AsyncClient, keys: Keys, clean_db: AsyncEngine
) -> None:
    await forget(clean_db)
    async with as_key(client, keys.admin) as admin:
        job = await enqueue(admin, queue="emails")
        await _pause_resume(admin, "emails", 1)
        await admin.post(f"/v1/jobs/{job['id']}/cancel")
    await make_key(clean_db, "extra", Role.VIEWER)
    async with as_key(client, keys.viewer) as viewer:
        paused = (await viewer.get("/v1/audit", params={"action": "queue.pause"})).json()
        assert [e["queue"] for e in paused["entries"]] == ["emails"]
        by_admin = (await viewer.get("/v1/audit", params={"actor": "admin"})).json()
        assert [e["action"] for e in by_admin["entries"]] == [
            "job.cancel",
            "queue.resume",
            "queue.pause",
        ]
        both = await viewer.get("/v1/audit", params={"actor": "internal", "action": "key.create"})
        assert [e["key_name"] for e in both.json()["entries"]] == ["extra"]
        assert both.json()["entries"][0]["detail"] == {"role": "viewer", "queues": None}
        assert (await viewer.get("/v1/audit", params={"actor": "nobody"})).json() == {
            "entries": [],
            "next_cursor": None,
        }
        assert (await viewer.get("/v1/audit", params={"action": "job.delete"})).status_code == 422


async def test_bad_limits_and_cursors_are_422(client: httpx.AsyncClient) -> None:
    assert (await client.get("/v1/audit", params={"limit": 0})).status_code == 422
    assert (await client.get("/v1/audit", params={"limit": 501})).status_code == 422
    r = await client.get("/v1/audit", params={"after": "garbage"})
    assert r.status_code == 422
    assert r.json()["errors"][0]["field"] == "query.after"


async def test_a_scoped_key_sees_only_its_queues_and_no_key_operations(
    client: httpx.AsyncClient, keys: Keys, clean_db: AsyncEngine
) -> None:
    async with as_key(client, keys.admin) as admin:
        await _pause_resume(admin, "emails", 1)
        await enqueue(admin, queue="billing.eu")
        await admin.post("/v1/queues/billing.eu/pause")
    async with as_key(client, keys.scoped_admin) as scoped:
        await enqueue(scoped, queue="billing.us")
        await scoped.post("/v1/queues/billing.us/pause")
        mine = (await scoped.get("/v1/audit")).json()["entries"]
        assert [(e["actor"], e["queue"]) for e in mine] == [
            ("billing-admin", "billing.us"),
            ("admin", "billing.eu"),
        ]
        # A filter cannot widen the view.
        assert (await scoped.get("/v1/audit", params={"action": "key.create"})).json()[
            "entries"
        ] == []
    async with as_key(client, keys.scoped_viewer) as viewer:
        assert [e["queue"] for e in (await viewer.get("/v1/audit")).json()["entries"]] == [
            "billing.us",
            "billing.eu",
        ]
    async with as_key(client, keys.admin) as admin:
        everything = (await admin.get("/v1/audit", params={"limit": 500})).json()["entries"]
        assert {e["action"] for e in everything} == {"key.create", "queue.pause", "queue.resume"}


async def test_viewers_and_admins_read_the_trail_others_do_not(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    for secret, expected in [
        (None, 401),
        (keys.producer, 403),
        (keys.worker, 403),
        (keys.viewer, 200),
        (keys.admin, 200),
    ]:
        async with as_key(client, secret) as c:
            assert (await c.get("/v1/audit")).status_code == expected
