"""``GET /metrics`` moves with the job lifecycle, times requests by route template, and shows depth.

Every scrape is parsed with prometheus_client's own parser, so the exposition stays valid.
"""

from __future__ import annotations

import httpx
from fastapi import FastAPI
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.api.state import app_state
from app.auth import store
from app.auth.keys import Role
from app.http.timing import Histogram, status_class
from app.maintenance.gauges import QueueGauges
from tests.api.helpers import claim, enqueue, lease, lease_call, running_app

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]

EVENTS = (
    "enqueued",
    "claimed",
    "completed",
    "failed",
    "dead",
    "released",
    "reaped",
    "cancelled",
    "retried",
)


async def scrape(client: httpx.AsyncClient, headers: dict[str, str] | None = None) -> Samples:
    """Every sample of one scrape, by name and labels (the text must parse)."""
    r = await client.get("/metrics", headers=headers or {})
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain")
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(r.text)
        for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    """One sample's value; 0 when the series does not exist (yet)."""
    return samples.get((name, frozenset(labels.items())), 0.0)


def summed(samples: Samples, name: str, **labels: str) -> float:
    """The sum of the samples of ``name`` whose labels include ``labels`` (any other labels)."""
    wanted = set(labels.items())
    return sum(v for (n, have), v in samples.items() if n == name and wanted <= have)


def events(samples: Samples, queue: str) -> dict[str, float]:
    return {e: summed(samples, "jobq_job_events_total", queue=queue, event=e) for e in EVENTS}


def delta(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {k: after[k] - before[k] for k in after if after[k] != before[k]}


async def test_each_transition_moves_its_counter_by_exactly_one_and_times_the_attempt(
    app: FastAPI, client: httpx.AsyncClient, clean_db: AsyncEngine
) -> None:
    service = app_state(app).running().services
    start = await scrape(client)
    q = "m"

    step = await scrape(client)
    a = await enqueue(client, queue=q)
    b = await enqueue(client, queue=q, max_attempts=1)
    c = await enqueue(client, queue=q)
    d = await enqueue(client, queue=q)
    await enqueue(client, queue="other-queue")
    now = await scrape(client)
    assert delta(events(now, q), events(step, q)) == {"enqueued": 4}
    assert delta(events(now, "other-queue"), events(step, "other-queue")) == {"enqueued": 1}

    step = now
    held = {j["id"]: j for j in await claim(client, "w1", [q], max_jobs=4)}
    now = await scrape(client)
    assert delta(events(now, q), events(step, q)) == {"claimed": 4}

    moves: list[tuple[str, dict[str, object], str]] = [
        ("complete", lease(held[a["id"]]), "completed"),
        ("fail", lease(held[b["id"]], error="boom"), "dead"),
        ("fail", lease(held[c["id"]], error="again", retry_after_seconds=0), "failed"),
        ("release", lease(held[d["id"]]), "released"),
    ]
    for op, item, kind in moves:
        step = await scrape(client)
        [result] = await lease_call(client, op, "w1", item)
        assert result["ok"], result
        assert delta(events(await scrape(client), q), events(step, q)) == {kind: 1}, op

    # A replay changes nothing, so counts nothing.
    step = await scrape(client)
    await lease_call(client, "complete", "w1", lease(held[a["id"]]))
    assert delta(events(await scrape(client), q), events(step, q)) == {}

    step = await scrape(client)
    [again] = await claim(client, "w2", [q], max_jobs=1)
    assert again["id"] in {c["id"], d["id"]}
    async with clean_db.begin() as conn:
        await conn.execute(text("UPDATE jobs SET lease_expires_at = now() - interval '1 s'"))
    assert len(await service.upkeep.reap(batch_size=10)) == 1
    now = await scrape(client)
    assert delta(events(now, q), events(step, q)) == {"claimed": 1, "reaped": 1}

    step = now
    pending = d if again["id"] == c["id"] else c
    assert (await client.post(f"/v1/jobs/{pending['id']}/cancel")).status_code == 200
    assert (await client.post(f"/v1/jobs/{b['id']}/retry")).status_code == 200
    end = await scrape(client)
    assert delta(events(end, q), events(step, q)) == {"cancelled": 1, "retried": 1}

    # Five claims waited; three attempts ended by complete or fail (release and reap time nothing).
    for name, count in (
        ("jobq_job_wait_duration_seconds", 5),
        ("jobq_job_run_duration_seconds", 3),
    ):
        counted = value(end, f"{name}_count", queue=q) - value(start, f"{name}_count", queue=q)
        assert counted == count, name
        assert value(end, f"{name}_bucket", queue=q, le="+Inf") == value(
            end, f"{name}_count", queue=q
        )
        assert 0 <= value(end, f"{name}_sum", queue=q) < 60


async def test_requests_are_timed_by_route_template_method_and_status_class(
    client: httpx.AsyncClient,
) -> None:
    job = await enqueue(client, queue="r")
    for job_id in (job["id"], job["id"] + 1000):
        await client.get(f"/v1/jobs/{job_id}")
    await client.get("/no/such/path/42")
    await client.request("BREW", "/v1/claim")
    samples = await scrape(client)
    name = "jobq_http_server_request_duration_seconds_count"

    def count(route: str, method: str, status: str) -> float:
        return value(samples, name, route=route, method=method, status_class=status)

    assert count("/v1/jobs", "POST", "2xx") == 1  # the fast path is timed too
    assert count("/v1/jobs/{job_id}", "GET", "2xx") == 1
    assert count("/v1/jobs/{job_id}", "GET", "4xx") == 1
    assert count("other", "GET", "4xx") == 1
    assert count("/v1/claim", "other", "4xx") == 1
    routes = {dict(labels)["route"] for (n, labels) in samples if n == name}
    # This scrape is timed once it is sent, so it is not in its own figures.
    assert routes == {"/v1/jobs", "/v1/jobs/{job_id}", "/v1/claim", "other"}


async def test_gauges_show_depth_as_the_loop_last_read_it_not_per_scrape(
    app: FastAPI, client: httpx.AsyncClient
) -> None:
    runtime = app_state(app).running()
    [gauges] = [loop for loop in runtime.runner.loops if isinstance(loop, QueueGauges)]
    await enqueue(client, queue="g")
    await enqueue(client, queue="g")
    await enqueue(client, queue="g", delay_seconds=3600)
    await claim(client, "w1", ["g"], max_jobs=1)
    assert await gauges.run_batch() >= 1
    samples = await scrape(client)
    depth = {
        state: value(samples, "jobq_queue_jobs", queue="g", state=state)
        for state in ("scheduled", "pending", "running", "succeeded", "dead", "cancelled")
    }
    assert depth == {
        "scheduled": 1,
        "pending": 1,
        "running": 1,
        "succeeded": 0,
        "dead": 0,
        "cancelled": 0,
    }
    assert 0 <= value(samples, "jobq_queue_oldest_pending_age_seconds", queue="g") < 60
    assert value(samples, "jobq_queue_paused", queue="g") == 0

    # A scrape reads what the loop read: another job shows after the next refresh only.
    await enqueue(client, queue="g")
    assert value(await scrape(client), "jobq_queue_jobs", queue="g", state="pending") == 1
    await gauges.run_batch()
    assert value(await scrape(client), "jobq_queue_jobs", queue="g", state="pending") == 2

    stamp = value(samples, "jobq_loop_last_success_timestamp_seconds", loop="promoter")
    assert stamp > 1.7e9
    assert value(samples, "jobq_claims_waiting") == 0


async def test_a_scoped_viewer_sees_only_its_queues_series(
    app: FastAPI, client: httpx.AsyncClient, clean_db: AsyncEngine
) -> None:
    await enqueue(client, queue="billing.invoices")
    await enqueue(client, queue="emails")
    runtime = app_state(app).running()
    [gauges] = [loop for loop in runtime.runner.loops if isinstance(loop, QueueGauges)]
    await gauges.run_batch()
    async with clean_db.begin() as conn:
        scoped = await store.create_key(
            conn, name="billing-viewer", role=Role.VIEWER, queues=["billing.*"]
        )
        viewer = await store.create_key(conn, name="viewer", role=Role.VIEWER, queues=None)
        producer = await store.create_key(conn, name="producer", role=Role.PRODUCER, queues=None)
    await runtime.keys.refresh()

    def queues_in(samples: Samples) -> set[str]:
        return {dict(labels)["queue"] for (_, labels) in samples if "queue" in dict(labels)}

    mine = await scrape(client, {"Authorization": f"Bearer {scoped}"})
    assert queues_in(mine) == {"billing.invoices"}
    assert summed(mine, "jobq_job_events_total", queue="billing.invoices", event="enqueued") == 1
    everyone = await scrape(client, {"Authorization": f"Bearer {viewer}"})
    assert queues_in(everyone) == {"billing.invoices", "emails"}
    refused = await client.get("/metrics", headers={"Authorization": f"Bearer {producer}"})
    assert refused.status_code == 403


def test_histogram_bounds_are_inclusive_and_cumulative() -> None:
    histogram = Histogram((0.1, 1.0))
    for seconds in (0.05, 0.1, 0.5, 1.0, 7.0):
        histogram.observe(seconds)
    assert histogram.buckets() == [("0.1", 2), ("1.0", 4), ("+Inf", 5)]
    assert histogram.total == 8.65
    assert [status_class(s) for s in (0, 101, 204, 302, 404, 503, 999)] == [
        "none",
        "1xx",
        "2xx",
        "3xx",
        "4xx",
        "5xx",
        "none",
    ]


async def test_events_carry_a_bounded_type_label_and_the_build_is_named(
    database_url: str, clean_db: AsyncEngine
) -> None:
    async with running_app(database_url, metrics_types_max=2) as client:
        for job_type in ("a", "b", "c", "d"):
            await enqueue(client, queue="typed", type=job_type)
        samples = await scrape(client)
        enqueued = {
            dict(labels)["type"]: v
            for (name, labels), v in samples.items()
            if name == "jobq_job_events_total" and dict(labels).get("queue") == "typed"
        }
        assert enqueued == {"a": 1, "b": 1, "other": 2}
        [build] = [labels for (name, labels) in samples if name == "jobq_build_info"]
        assert dict(build)["version"] and dict(build)["python"].count(".") == 2


async def test_limits_and_schedules_have_gauges_as_the_loop_last_read_them(
    app: FastAPI, client: httpx.AsyncClient, clean_db: AsyncEngine
) -> None:
    runtime = app_state(app).running()
    [gauges] = [loop for loop in runtime.runner.loops if isinstance(loop, QueueGauges)]
    r = await client.put(
        "/v1/limits", json={"scope": "key", "pattern": "customer:*", "max_running": 1}
    )
    assert r.status_code == 201, r.text
    for _ in range(3):
        await enqueue(client, queue="limited", concurrency_key="customer:42")
    [held] = await claim(client, "w1", ["limited"], max_jobs=3)
    assert held["concurrency_key"] == "customer:42"
    schedule = {"interval_seconds": 3600, "template": {"queue": "limited", "type": "tick"}}
    assert (await client.put("/v1/schedules/hourly", json=schedule)).status_code == 201
    await gauges.run_batch()
    samples = await scrape(client)
    limit = {"scope": "key", "pattern": "customer:*"}
    assert value(samples, "jobq_limit_running", **limit) == 1
    assert value(samples, "jobq_limit_max_running", **limit) == 1
    assert value(samples, "jobq_limit_held_back", **limit) == 2
    labels = {"schedule": "hourly", "queue": "limited"}
    assert value(samples, "jobq_schedule_next_run_timestamp_seconds", **labels) > 1.7e9
    assert value(samples, "jobq_schedule_errored", **labels) == 0
    assert ("jobq_schedule_last_run_timestamp_seconds", frozenset(labels.items())) not in samples
