"""The schedules API: create or replace, read, list, pause, resume, delete; roles, audit, 422s."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.api.state import app_state
from app.domain.cron import JobTemplate, ScheduleSpec, Timing
from app.maintenance.gauges import QueueGauges
from tests.api.test_metrics import scrape, value
from tests.keys import Keys, as_key


@pytest.fixture(autouse=True)
async def no_schedules_left(clean_db: AsyncEngine) -> AsyncIterator[None]:
    """No schedule outlives the test (a later test's server would run it)."""
    yield
    async with clean_db.begin() as conn:
        await conn.execute(text("TRUNCATE schedules"))


NIGHTLY: dict[str, Any] = {
    "cron": "30 2 * * *",
    "timezone": "Europe/Berlin",
    "template": {"queue": "billing.reports", "type": "nightly", "payload": {"format": "pdf"}},
    "catch_up": 1,
}


async def audit_rows(engine: AsyncEngine) -> list[dict[str, Any]]:
    async with engine.connect() as conn:
        result = await conn.execute(
            text(
                "SELECT actor, action, outcome, queue, state_before, state_after, detail "
                "FROM audit_log WHERE action LIKE 'schedule.%' ORDER BY id"
            )
        )
        return [dict(r) for r in result.mappings()]


async def test_create_read_replace_pause_resume_delete(
    client: httpx.AsyncClient, clean_db: AsyncEngine
) -> None:
    created = await client.put("/v1/schedules/nightly-report", json=NIGHTLY)
    assert created.status_code == 201, created.text
    body = created.json()
    assert body["name"] == "nightly-report" and body["cron"] == "30 2 * * *"
    assert body["interval_seconds"] is None and body["timezone"] == "Europe/Berlin"
    assert body["template"] == {
        "queue": "billing.reports",
        "type": "nightly",
        "payload": {"format": "pdf"},
        "priority": 0,
        "max_attempts": None,
        "lease_seconds": None,
        "timeout_seconds": None,
        "concurrency_key": None,
    }
    assert body["paused"] is False and body["source"] == "api" and body["catch_up"] == 1
    assert body["last_run_at"] is None and body["last_job_id"] is None
    assert body["next_run_at"].endswith("Z") or "+00:00" in body["next_run_at"]

    same = await client.put("/v1/schedules/nightly-report", json=NIGHTLY)
    assert same.status_code == 200 and same.json()["next_run_at"] == body["next_run_at"]
    replaced = await client.put(
        "/v1/schedules/nightly-report", json={**NIGHTLY, "template": {"type": "t2"}}
    )
    assert replaced.status_code == 200
    assert replaced.json()["template"]["queue"] == "default"
    assert replaced.json()["next_run_at"] == body["next_run_at"]  # same timing: same next run

    listed = await client.get("/v1/schedules")
    assert listed.status_code == 200
    assert [s["name"] for s in listed.json()["schedules"]] == ["nightly-report"]
    assert listed.json()["next_cursor"] is None
    one = await client.get("/v1/schedules/nightly-report")
    assert one.status_code == 200 and one.json()["template"]["type"] == "t2"

    paused = await client.post("/v1/schedules/nightly-report/pause")
    assert paused.status_code == 200 and paused.json()["paused"] is True
    again = await client.post("/v1/schedules/nightly-report/pause")
    assert again.status_code == 200 and again.json()["paused"] is True
    resumed = await client.post("/v1/schedules/nightly-report/resume")
    assert resumed.status_code == 200 and resumed.json()["paused"] is False

    deleted = await client.delete("/v1/schedules/nightly-report")
    assert deleted.status_code == 200 and deleted.json()["name"] == "nightly-report"
    assert (await client.get("/v1/schedules/nightly-report")).status_code == 404
    assert (await client.delete("/v1/schedules/nightly-report")).status_code == 404
    assert (await client.post("/v1/schedules/nightly-report/pause")).status_code == 404

    assert [
        (r["action"], r["outcome"], r["state_before"], r["state_after"])
        for r in await audit_rows(clean_db)
    ] == [
        ("schedule.create", "changed", None, "active"),
        ("schedule.update", "unchanged", "active", "active"),
        ("schedule.update", "changed", "active", "active"),
        ("schedule.pause", "changed", "active", "paused"),
        ("schedule.pause", "unchanged", "paused", "paused"),
        ("schedule.resume", "changed", "paused", "active"),
        ("schedule.delete", "changed", "active", None),
    ]
    [first, *_] = await audit_rows(clean_db)
    assert first["actor"] == "anonymous" and first["queue"] == "billing.reports"
    assert first["detail"]["schedule"] == "nightly-report"
    trail = await client.get("/v1/audit", params={"action": "schedule.create"})
    assert trail.status_code == 200 and len(trail.json()["entries"]) == 1


async def test_interval_schedules_and_paging(client: httpx.AsyncClient) -> None:
    for name in ("c", "a", "b"):
        r = await client.put(
            f"/v1/schedules/{name}",
            json={"interval_seconds": 90, "template": {"type": "t"}, "paused": True},
        )
        assert r.status_code == 201, r.text
        assert r.json()["paused"] is True and r.json()["interval_seconds"] == 90
    page = await client.get("/v1/schedules", params={"limit": 2})
    assert [s["name"] for s in page.json()["schedules"]] == ["a", "b"]
    cursor = page.json()["next_cursor"]
    rest = await client.get("/v1/schedules", params={"limit": 2, "after": cursor})
    assert [s["name"] for s in rest.json()["schedules"]] == ["c"]
    assert rest.json()["next_cursor"] is None


def problem_fields(response: httpx.Response) -> list[str]:
    assert response.status_code == 422, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    return [e["field"] for e in response.json()["errors"]]


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"cron": "61 * * * *"}, "body.cron"),
        ({"cron": "0 0 30 2 *"}, "body.cron"),
        ({"cron": "H * * * *"}, "body.cron"),
        ({"cron": "* * * *"}, "body.cron"),
        ({"cron": ""}, "body.cron"),
        ({"cron": "x" * 201}, "body.cron"),
        ({"cron": "0 0 * * m\u00f6n"}, "body.cron"),
        ({"timezone": "Mars/Olympus"}, "body.timezone"),
        ({"timezone": "../../../etc/passwd"}, "body.timezone"),
        ({"timezone": "CEST"}, "body.timezone"),
        ({"timezone": ""}, "body.timezone"),
        # Names only a host's zoneinfo holds, or that are no place's time.
        ({"timezone": "localtime"}, "body.timezone"),
        ({"timezone": "Factory"}, "body.timezone"),
        ({"timezone": "posixrules"}, "body.timezone"),
        ({"timezone": "posix/Europe/Berlin"}, "body.timezone"),
        ({"timezone": "right/UTC"}, "body.timezone"),
        ({"cron": None}, "body.cron"),  # neither cron nor interval
        ({"interval_seconds": 60}, "body.interval_seconds"),  # both
        ({"cron": None, "interval_seconds": 0}, "body.interval_seconds"),
        ({"cron": None, "interval_seconds": "60"}, "body.interval_seconds"),
        ({"template": {"queue": "no spaces", "type": "t"}}, "body.template.queue"),
        ({"template": {"queue": "q"}}, "body.template.type"),
        ({"template": {"type": "t", "lease_seconds": 0}}, "body.template.lease_seconds"),
        ({"template": {"type": "t", "priority": 2**31}}, "body.template.priority"),
        ({"template": {"type": "t", "run_at": "2030-01-01T00:00:00Z"}}, "body.template.run_at"),
        ({"catch_up": 101}, "body.catch_up"),
        ({"catch_up": -1}, "body.catch_up"),
        ({"paused": "yes"}, "body.paused"),
        ({"every": "day"}, "body.every"),
    ],
)
async def test_unusable_definitions_are_422_naming_the_field(
    client: httpx.AsyncClient, change: dict[str, Any], field: str
) -> None:
    response = await client.put("/v1/schedules/bad", json={**NIGHTLY, **change})
    assert field in problem_fields(response)
    assert (await client.get("/v1/schedules/bad")).status_code == 404


@pytest.mark.parametrize(
    "name", ["-leading", "sp ace", "x" * 129, "semi;colon", "%00", "caf\u00e9"]
)
async def test_names_are_bounded(client: httpx.AsyncClient, name: str) -> None:
    response = await client.put(f"/v1/schedules/{name}", json=NIGHTLY)
    assert response.status_code in (404, 422), response.text  # "%00" may not route at all
    if response.status_code == 422:
        assert "path.name" in problem_fields(response)
    listing = await client.get("/v1/schedules", params={"after": name})
    assert listing.status_code == 422


async def test_viewers_read_and_admins_change(client: httpx.AsyncClient, keys: Keys) -> None:
    admin, viewer = as_key(client, keys.admin), as_key(client, keys.viewer)
    producer = as_key(client, keys.producer)
    assert (await admin.put("/v1/schedules/n", json=NIGHTLY)).status_code == 201
    assert (await viewer.get("/v1/schedules")).status_code == 200
    assert (await viewer.get("/v1/schedules/n")).status_code == 200
    for call in (
        viewer.put("/v1/schedules/n", json=NIGHTLY),
        viewer.delete("/v1/schedules/n"),
        viewer.post("/v1/schedules/n/pause"),
        viewer.post("/v1/schedules/n/resume"),
        producer.get("/v1/schedules"),
    ):
        assert (await call).status_code == 403
    assert (await as_key(client, None).get("/v1/schedules")).status_code == 401


async def test_scoped_keys_see_and_change_their_queues_only(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    admin, scoped = as_key(client, keys.admin), as_key(client, keys.scoped_admin)
    other = {**NIGHTLY, "template": {"queue": "emails", "type": "t"}}
    assert (await admin.put("/v1/schedules/emails-digest", json=other)).status_code == 201
    assert (await scoped.put("/v1/schedules/billing", json=NIGHTLY)).status_code == 201
    listed = await as_key(client, keys.scoped_viewer).get("/v1/schedules")
    assert [s["name"] for s in listed.json()["schedules"]] == ["billing"]
    assert (await scoped.get("/v1/schedules/emails-digest")).status_code == 403
    assert (await scoped.put("/v1/schedules/x", json=other)).status_code == 403
    # Taking over another queue's schedule by its name is refused too.
    assert (await scoped.put("/v1/schedules/emails-digest", json=NIGHTLY)).status_code == 403
    assert (await scoped.post("/v1/schedules/emails-digest/pause")).status_code == 403
    assert (await scoped.delete("/v1/schedules/emails-digest")).status_code == 403


async def test_file_schedules_are_changed_through_the_file(
    app: FastAPI, client: httpx.AsyncClient
) -> None:
    service = app_state(app).running().services
    spec = ScheduleSpec(
        timing=Timing(interval_seconds=300), template=JobTemplate(queue="q", type="t")
    )
    await service.schedules.sync([("from-file", spec)], actor="file:test")
    shown = await client.get("/v1/schedules/from-file")
    assert shown.json()["source"] == "file"
    replaced = await client.put("/v1/schedules/from-file", json=NIGHTLY)
    assert replaced.status_code == 409
    assert "JOBQ_SCHEDULES" in replaced.json()["detail"]
    assert (await client.delete("/v1/schedules/from-file")).status_code == 409
    assert (await client.post("/v1/schedules/from-file/pause")).json()["paused"] is True
    assert (await client.post("/v1/schedules/from-file/resume")).json()["paused"] is False


async def test_a_producer_cannot_take_or_suppress_a_schedule_run(
    app: FastAPI, client: httpx.AsyncClient, keys: Keys
) -> None:
    """Regression (issue 18, defect 3): a run used to be the job with the idempotency key
    ``schedule:<name>:<instant>``, so a producer who predicted it from next_run_at enqueued its
    own job under that key and the scheduler adopted it as the run."""
    admin, producer = as_key(client, keys.admin), as_key(client, keys.scoped_producer)
    hourly = {
        "interval_seconds": 3600,
        "template": {"queue": "billing.hq", "type": "report", "payload": {"real": True}},
    }
    made = await admin.put("/v1/schedules/nightly", json=hourly)
    assert made.status_code == 201, made.text
    due = datetime.fromisoformat(made.json()["next_run_at"])
    predicted = f"schedule:nightly:{due.astimezone(UTC):%Y-%m-%dT%H:%M:%SZ}"
    evil_job = {"queue": "billing.hq", "type": "evil", "idempotency_key": predicted}
    evil = await producer.post("/v1/jobs", json=evil_job)
    assert evil.status_code == 201, evil.text

    service = app_state(app).running().services
    outcome = await service.schedules.enqueue_runs(batch_size=10, now=due)
    assert (outcome.schedules, outcome.enqueued) == (1, 1)
    shown = (await admin.get("/v1/schedules/nightly")).json()
    assert datetime.fromisoformat(shown["last_run_at"]) == due
    assert shown["last_job_id"] != evil.json()["id"]
    run = (await admin.get(f"/v1/jobs/{shown['last_job_id']}")).json()
    assert (run["queue"], run["type"], run["payload"]) == ("billing.hq", "report", {"real": True})
    assert datetime.fromisoformat(run["run_at"]) == due
    # The producer's job is an ordinary job of its own, and its key still answers it alone.
    mine = (await admin.get(f"/v1/jobs/{evil.json()['id']}")).json()
    assert (mine["type"], mine["payload"], mine["status"]) == ("evil", None, "pending")
    replay = await producer.post("/v1/jobs", json=evil_job)
    assert replay.status_code == 200 and replay.json()["id"] == evil.json()["id"]


async def test_a_schedule_no_instance_can_plan_is_parked_visibly_until_changed(
    app: FastAPI, client: httpx.AsyncClient, clean_db: AsyncEngine
) -> None:
    """Regression (issue 18, defect 9): a schedule whose zone this instance does not know (as
    another release or host wrote it) was skipped without a trace and locked again every pass."""
    assert (await client.put("/v1/schedules/nightly", json=NIGHTLY)).status_code == 201
    async with clean_db.begin() as conn:
        await conn.execute(
            text(
                "UPDATE schedules SET timezone = 'Mars/Olympus', "
                "next_run_at = now() - interval '1 minute' WHERE name = 'nightly'"
            )
        )
    service = app_state(app).running().services
    first = await service.schedules.enqueue_runs(batch_size=10)
    assert [name for name, _ in first.failed] == ["nightly"] and first.enqueued == 0

    shown = (await client.get("/v1/schedules/nightly")).json()
    assert "Mars/Olympus" in shown["last_error"] and shown["errored_at"] is not None
    listed = (await client.get("/v1/schedules")).json()["schedules"]
    assert [s["last_error"] for s in listed] == [shown["last_error"]]
    runtime = app_state(app).running()
    [gauges] = [loop for loop in runtime.runner.loops if isinstance(loop, QueueGauges)]
    await gauges.run_batch()
    samples = await scrape(client)
    assert value(samples, "jobq_schedules_errored", queue="billing.reports") == 1

    # Parked: later passes neither lock nor report it, and its row does not move.
    async with clean_db.connect() as conn:
        before = (
            (await conn.execute(text("SELECT * FROM schedules WHERE name = 'nightly'")))
            .mappings()
            .one()
        )
    for _ in range(3):
        later = await service.schedules.enqueue_runs(batch_size=10)
        assert (later.schedules, later.failed) == (0, ())
    async with clean_db.connect() as conn:
        after = (
            (await conn.execute(text("SELECT * FROM schedules WHERE name = 'nightly'")))
            .mappings()
            .one()
        )
    assert after == before

    # A change clears the error, and the schedule runs again.
    fixed = await client.put(
        "/v1/schedules/nightly", json={**NIGHTLY, "interval_seconds": 60, "cron": None}
    )
    assert fixed.status_code == 200, fixed.text
    assert (fixed.json()["last_error"], fixed.json()["errored_at"]) == (None, None)
    await gauges.run_batch()
    assert value(await scrape(client), "jobq_schedules_errored", queue="billing.reports") == 0
    due = datetime.fromisoformat(fixed.json()["next_run_at"])
    assert (await service.schedules.enqueue_runs(batch_size=10, now=due)).enqueued == 1


async def test_a_resume_clears_a_schedule_error(
    app: FastAPI, client: httpx.AsyncClient, clean_db: AsyncEngine
) -> None:
    assert (await client.put("/v1/schedules/nightly", json=NIGHTLY)).status_code == 201
    async with clean_db.begin() as conn:
        await conn.execute(
            text(
                "UPDATE schedules SET last_error = 'boom', errored_at = now() "
                "WHERE name = 'nightly'"
            )
        )
    resumed = await client.post("/v1/schedules/nightly/resume")
    assert resumed.status_code == 200
    assert (resumed.json()["last_error"], resumed.json()["errored_at"]) == (None, None)
    assert resumed.json()["paused"] is False
