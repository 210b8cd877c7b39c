"""The hand-written responses match the response models field for field (no database)."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import pytest

from app.api import render
from app.api.lease_models import ClaimedJob, LeaseResults, SettleResults
from app.api.schemas import Job
from app.domain import records
from app.domain.types import LeaseOutcome
from app.stored_json import UnreadableJson

NOW = datetime(2026, 12, 1, 10, 0, 0, 123456, tzinfo=UTC)


def _row(**overrides: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "id": 7,
        "queue": "emails",
        "type": "welcome",
        "status": "running",
        "payload": {"user": 42, "tags": ["a", None], "big": 1.5},
        "priority": -3,
        "attempts": 2,
        "max_attempts": 10,
        "run_at": NOW,
        "lease_seconds": 30,
        "timeout_seconds": None,
        "idempotency_key": "k",
        "concurrency_key": "customer:42",
        "lease_id": uuid.UUID("9f1c0000-0000-4000-8000-000000000001"),
        "worker_id": "host-a:1",
        "lease_expires_at": NOW + timedelta(seconds=30),
        "result": None,
        "last_error": "boom",
        "errors": [{"attempt": 1, "error": "boom"}],
        "checkpoint": {"last_id": 800},
        "checkpoint_at": NOW.replace(microsecond=0),
        "progress": None,
        "created_at": NOW - timedelta(days=1),
        "started_at": NOW,
        "finished_at": None,
        "updated_at": NOW,
        # Columns the API does not show.
        "lease_granted_seconds": 30,
        "lease_ended_by": None,
        "idempotency_hash": "h",
        "lease_key_id": None,
        "lease_instance": "host-a:1",
        "flow_keys": None,
        "awaited": False,
        "schedule_name": None,
        "scheduled_for": None,
        "progress_at": None,
        "traceparent": None,
        "callback_url": None,
        "callback_key_id": None,
        "depends_on": None,
        "on_parent_failure": None,
        "has_dependents": False,
        "ordering_key": None,
        "workflow_id": None,
        "workflow_step": None,
    }
    row.update(overrides)
    return row


def _as_pydantic(model: Any, data: dict[str, Any]) -> Any:
    dumped = orjson.loads(model.model_validate(data).model_dump_json())
    # Only a job with stored JSON no reader takes carries it (app/stored_json.py).
    if dumped.get("stored_json_errors", 0) is None:
        del dumped["stored_json_errors"]
    return dumped


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"lease_id": None, "status": "pending", "payload": None},
        {"status": "scheduled", "lease_ended_by": "fail"},
    ],
)
def test_a_job_renders_as_the_job_model_does(overrides: dict[str, Any]) -> None:
    row = _row(**overrides)
    ours = orjson.loads(render.json_response(render.job(records.Job(**row))).body)
    assert ours == _as_pydantic(Job, {**row, "retrying": records.Job(**row).retrying})
    assert list(ours) == [f for f in Job.model_fields if f != "stored_json_errors"]


def test_a_job_with_unreadable_stored_json_renders_it_as_null_and_says_why() -> None:
    row = _row(payload=UnreadableJson("a number beyond a double's range"))
    ours = orjson.loads(render.json_response(render.job(records.Job(**row))).body)
    expected = {
        **row,
        "payload": None,
        "retrying": False,
        "stored_json_errors": {"payload": "a number beyond a double's range"},
    }
    assert ours == _as_pydantic(Job, expected)
    assert ours["payload"] is None and list(ours)[-1] == "stored_json_errors"


def test_a_claimed_job_renders_as_the_claimed_job_model_does() -> None:
    row = _row()
    ours = orjson.loads(render.json_response(render.claimed(records.Job(**row))).body)
    assert ours == _as_pydantic(ClaimedJob, {**row, "attempt": row["attempts"], "retrying": False})


def test_lease_results_render_as_the_lease_results_model_does() -> None:
    outcomes = [
        LeaseOutcome(job_id=1, status="succeeded"),
        LeaseOutcome(job_id=2, status=None, cancelled=True),
        LeaseOutcome(job_id=3, status="scheduled", run_at=NOW, lease_expires_at=None),
    ]
    ours = orjson.loads(render.lease_results_response(outcomes).body)
    expected = {"results": [render.lease_result(o) for o in outcomes]}
    assert ours == orjson.loads(LeaseResults.model_validate(expected).model_dump_json())


@pytest.mark.parametrize(
    "problem",
    [
        None,
        {
            "type": "https://jobq.dev/problems/validation-error",
            "title": "Unprocessable Content",
            "status": 422,
            "detail": "a value is out of range or malformed",
        },
    ],
)
def test_a_settle_with_claim_next_renders_as_the_settle_results_model_does(
    problem: dict[str, Any] | None,
) -> None:
    outcomes = [LeaseOutcome(job_id=1, status="succeeded")]
    rows = [records.Job(**_row(id=8)), records.Job(**_row(id=9))]
    ours = orjson.loads(render.settle_response(outcomes, rows, problem).body)
    assert ours == orjson.loads(
        SettleResults.model_validate(ours).model_dump_json(exclude_unset=True)
    )
    # Exactly what POST /v1/claim answers for the same rows.
    claim_answer = render.json_response({"jobs": [render.claimed(r) for r in rows]})
    assert ours["claimed"] == orjson.loads(claim_answer.body)
    assert [j["id"] for j in ours["claimed"]["jobs"]] == [8, 9]
    assert ours.get("claim_error") == problem


def test_an_integer_past_64_bits_is_written_exactly() -> None:
    from app.api.render import json_response

    big = 2**70
    response = json_response({"payload": {"n": big}, "at": NOW})
    assert json.loads(response.body) == {
        "payload": {"n": big},
        "at": NOW.isoformat().replace("+00:00", "Z"),
    }
