"""The Client's composing calls against httpx.MockTransport: request shapes, answers, and what a
JobContext makes of a claim's ``parents``."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest

from jobq_client import Callback, Client, JobContext, Step, WorkflowWaitTimeout


def recording(answer: Any, status: int = 200) -> tuple[Client, list[httpx.Request]]:
    """A client whose every request is recorded and answered ``answer``."""
    requests: list[httpx.Request] = []

    def handle(request: httpx.Request) -> httpx.Response:
        requests.append(request)
        return httpx.Response(status, json=answer(request) if callable(answer) else answer)

    return Client("http://jobq.test", transport=httpx.MockTransport(handle)), requests


def body(request: httpx.Request) -> Any:
    return json.loads(request.content)


async def test_enqueue_sends_the_composing_fields_only_when_given() -> None:
    client, requests = recording({"id": 1})
    async with client:
        await client.enqueue("t", depends_on=(3, 4), on_parent_failure="run")
        await client.enqueue("t", ordering_key="account:1")
        await client.enqueue("t")
    first, second, third = (body(r) for r in requests)
    assert first["depends_on"] == [3, 4] and first["on_parent_failure"] == "run"
    assert "ordering_key" not in first
    assert second["ordering_key"] == "account:1" and "depends_on" not in second
    assert not {"depends_on", "on_parent_failure", "ordering_key"} & set(third)


async def test_a_batch_sends_its_callback_and_answers_it_beside_the_list() -> None:
    answer = {"jobs": [{"id": 1}, {"id": 2}], "callback": {"id": 3, "status": "waiting"}}
    client, requests = recording(answer, status=201)
    async with client:
        batch = await client.enqueue_batch(
            [{"type": "a", "depends_on": (9,)}, {"type": "b", "ordering_key": "k"}],
            callback=Callback(
                "done",
                {"x": 1},
                when="all_finished",
                queue="q",
                priority=2,
                extra={"idempotency_key": "cb-1"},
            ),
        )
        with_dict = await client.enqueue_batch(
            [{"type": "a"}], callback={"type": "done", "when": "all_succeeded"}
        )
    sent = body(requests[0])
    assert sent["jobs"][0]["depends_on"] == [9]
    assert sent["jobs"][1]["ordering_key"] == "k"
    assert all(item["idempotency_key"].startswith("auto:") for item in sent["jobs"])
    assert sent["callback"] == {
        "type": "done",
        "queue": "q",
        "payload": {"x": 1},
        "when": "all_finished",
        "priority": 2,
        "idempotency_key": "cb-1",
    }
    assert batch == [{"id": 1}, {"id": 2}] and batch.callback == {"id": 3, "status": "waiting"}
    # A callback without a key gets one, so the batch stays safe to send again.
    assert body(requests[1])["callback"]["idempotency_key"].startswith("auto:")
    assert with_dict.callback is not None


async def test_a_batch_without_a_callback_sends_none_and_answers_none() -> None:
    client, requests = recording({"jobs": [{"id": 1}]}, status=201)
    async with client:
        batch = await client.enqueue_batch([{"type": "a"}])
    assert "callback" not in body(requests[0])
    assert batch == [{"id": 1}] and batch.callback is None


async def test_workflow_calls_send_steps_and_reach_their_routes() -> None:
    client, requests = recording({"id": 5, "state": "running", "steps": []})
    async with client:
        await client.workflow(
            "w",
            [
                Step("a", "t", payload=1, run_at=datetime(2030, 1, 1, tzinfo=UTC)),
                Step("b", "t", after=["a"], on_parent_failure="run", max_attempts=2),
                {"name": "c", "type": "t", "after": ("b",), "queue": "q"},
            ],
        )
        await client.get_workflow(5)
        await client.cancel_workflow(5)
        await client.retry_workflow(5)
    create = requests[0]
    assert (create.method, create.url.path) == ("POST", "/v1/workflows")
    sent = body(create)
    # A key of its own, so that the create is safe to send again.
    assert sent.pop("idempotency_key").startswith("auto:")
    assert sent == {
        "name": "w",
        "steps": [
            {
                "name": "a",
                "type": "t",
                "queue": "default",
                "payload": 1,
                "after": [],
                "run_at": "2030-01-01T00:00:00+00:00",
            },
            {
                "name": "b",
                "type": "t",
                "queue": "default",
                "payload": None,
                "after": ["a"],
                "max_attempts": 2,
                "on_parent_failure": "run",
            },
            {"name": "c", "type": "t", "after": ["b"], "queue": "q"},
        ],
    }
    assert [(r.method, r.url.path) for r in requests[1:]] == [
        ("GET", "/v1/workflows/5"),
        ("POST", "/v1/workflows/5/cancel"),
        ("POST", "/v1/workflows/5/retry"),
    ]


async def test_a_workflow_create_sends_the_callers_own_key_as_it_is() -> None:
    client, requests = recording({"id": 5, "state": "running", "steps": []})
    async with client:
        await client.workflow("w", [Step("a", "t")], idempotency_key="nightly-2030-01-01")
    assert body(requests[0])["idempotency_key"] == "nightly-2030-01-01"


async def test_wait_workflow_long_polls_the_last_open_step_then_reads_again() -> None:
    reads = iter(
        [
            {
                "id": 5,
                "state": "running",
                "counts": {"succeeded": 1, "waiting": 1},
                "steps": [
                    {"name": "a", "job": {"id": 10, "status": "succeeded"}},
                    {"name": "b", "job": {"id": 11, "status": "waiting"}},
                ],
            },
            {"id": 5, "state": "succeeded", "counts": {"succeeded": 2}, "steps": []},
        ]
    )

    def answer(request: httpx.Request) -> Any:
        if request.url.path == "/v1/workflows/5":
            return next(reads)
        return {"id": 11, "status": "succeeded"}

    client, requests = recording(answer)
    async with client:
        done = await client.wait_workflow(5, timeout=5, poll_seconds=2)
    assert done["state"] == "succeeded"
    assert [r.url.path for r in requests] == ["/v1/workflows/5", "/v1/jobs/11", "/v1/workflows/5"]
    assert float(requests[1].url.params["wait_seconds"]) == 2


async def test_wait_workflow_times_out_with_the_workflow_as_last_seen() -> None:
    running = {
        "id": 5,
        "state": "running",
        "counts": {"pending": 1},
        "steps": [{"name": "a", "job": {"id": 10, "status": "pending"}}],
    }

    def answer(request: httpx.Request) -> Any:
        return running if "workflows" in request.url.path else {"id": 10, "status": "pending"}

    client, _ = recording(answer)
    async with client:
        with pytest.raises(WorkflowWaitTimeout) as timed_out:
            await client.wait_workflow(5, timeout=0.05, poll_seconds=0.01)
    assert timed_out.value.workflow == running and timed_out.value.workflow_id == 5
    assert "still running: 1 pending" in str(timed_out.value)
    with pytest.raises(ValueError):
        await Client("http://jobq.test").wait_workflow(5, timeout=-1)


PARENTS = {
    "total": 3,
    "succeeded": 2,
    "dead": 1,
    "cancelled": 0,
    "failed_ids": [12],
    "jobs": [
        {"id": 10, "step": "a", "status": "succeeded", "result": 1, "result_by_reference": False},
        {
            "id": 11,
            "step": None,
            "status": "succeeded",
            "result": None,
            "result_by_reference": True,
        },
        {"id": 12, "step": None, "status": "dead", "result": None, "result_by_reference": False},
    ],
}


async def test_a_context_names_its_parents_results_by_step_or_id() -> None:
    ctx = JobContext({"id": 20, "type": "t", "parents": PARENTS})
    assert ctx.parents == PARENTS
    assert ctx.parent_results == {"a": 1, 12: None}  # the one by reference is left out
    with pytest.raises(RuntimeError):
        await ctx.fetch_parent_results()

    read: list[int] = []

    async def reader(job_id: int) -> dict[str, Any]:
        read.append(job_id)
        return {"id": job_id, "result": {"big": True}}

    ctx = JobContext({"id": 20, "type": "t", "parents": PARENTS}, job_reader=reader)
    assert await ctx.fetch_parent_results() == {"a": 1, 11: {"big": True}, 12: None}
    assert read == [11]

    alone = JobContext({"id": 21, "type": "t", "parents": None})
    assert alone.parents is None and alone.parent_results == {}
    assert await alone.fetch_parent_results() == {}
