"""Client.wait against httpx.MockTransport: its rounds, its timeout, and what it retries."""

from __future__ import annotations

import time

import httpx
import pytest

from jobq_client import Client, JobqError, WaitTimeout


def job(status: str) -> dict[str, object]:
    return {"id": 7, "status": status}


def client_answering(*answers: httpx.Response) -> tuple[Client, list[httpx.Request]]:
    """A client whose requests get ``answers`` in turn (the last one from then on)."""
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return answers[min(len(seen), len(answers)) - 1]

    return Client("http://jobq.test", transport=httpx.MockTransport(answer)), seen


async def test_each_round_asks_for_at_most_twenty_seconds_and_a_finished_job_ends_it() -> None:
    client, seen = client_answering(httpx.Response(200, json=job("succeeded")))
    async with client:
        assert (await client.wait(7, timeout=300))["status"] == "succeeded"
        assert seen[0].url.path == "/v1/jobs/7"
        assert seen[0].url.params["wait_seconds"] == "20.0"
        await client.wait(7, timeout=3.5)
        assert float(seen[1].url.params["wait_seconds"]) <= 3.5


@pytest.mark.parametrize("status", ["succeeded", "dead", "cancelled"])
async def test_any_final_state_is_an_answer(status: str) -> None:
    client, _ = client_answering(httpx.Response(200, json=job(status)))
    async with client:
        assert (await client.wait(7, timeout=5))["status"] == status


async def test_unfinished_answers_that_come_early_are_paced_then_time_out() -> None:
    # A service that ignores wait_seconds (an older release) answers at once every time.
    client, seen = client_answering(httpx.Response(200, json=job("running")))
    async with client:
        started = time.monotonic()
        with pytest.raises(WaitTimeout) as timed_out:
            await client.wait(7, timeout=0.6)
        assert 0.55 <= time.monotonic() - started < 2
    assert timed_out.value.job == job("running") and timed_out.value.timeout == 0.6
    assert "job 7 not finished after 0.6 s (still running)" in str(timed_out.value)
    assert len(seen) <= 6, "the loop spun instead of pausing"


async def test_transient_failures_are_retried_and_others_raised() -> None:
    client, seen = client_answering(
        httpx.Response(503, json={"title": "Service Unavailable"}),
        httpx.Response(200, json=job("succeeded")),
    )
    async with client:
        assert (await client.wait(7, timeout=5))["status"] == "succeeded"
    assert len(seen) == 2

    client, seen = client_answering(httpx.Response(404, json={"title": "Not Found"}))
    async with client:
        with pytest.raises(JobqError) as missing:
            await client.wait(7, timeout=5)
    assert missing.value.status == 404 and len(seen) == 1


async def test_only_transient_failures_until_the_time_is_up_raise_wait_timeout() -> None:
    client, _ = client_answering(httpx.Response(502, text="bad gateway"))
    async with client:
        with pytest.raises(WaitTimeout) as timed_out:
            await client.wait(7, timeout=0.3)
    assert timed_out.value.job is None and isinstance(timed_out.value.__cause__, JobqError)


async def test_bad_arguments_are_refused() -> None:
    client, seen = client_answering(httpx.Response(200, json=job("succeeded")))
    async with client:
        with pytest.raises(ValueError):
            await client.wait(7, timeout=-1)
        with pytest.raises(ValueError):
            await client.wait(7, timeout=5, poll_seconds=21)
    assert seen == []


async def test_enqueue_and_wait_enqueues_then_waits() -> None:
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.method == "POST":
            return httpx.Response(201, json=job("pending"))
        return httpx.Response(200, json={**job("succeeded"), "result": 3})

    async with Client("http://jobq.test", transport=httpx.MockTransport(answer)) as client:
        done = await client.enqueue_and_wait("add", {"a": 1}, queue="rpc", timeout=5)
    assert done["result"] == 3
    assert [(r.method, r.url.path) for r in seen] == [("POST", "/v1/jobs"), ("GET", "/v1/jobs/7")]


async def test_enqueue_and_wait_of_a_replayed_finished_job_does_not_wait() -> None:
    client, seen = client_answering(httpx.Response(200, json=job("succeeded")))
    async with client:
        done = await client.enqueue_and_wait("add", idempotency_key="k", timeout=5)
    assert done["status"] == "succeeded" and [r.method for r in seen] == ["POST"]
