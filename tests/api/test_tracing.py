"""Trace context: one trace from the producer's span through the service to the handler.

The service runs in this process (ASGI transport), so the SDK's in-memory exporter sees the
producer's, the service's and the worker's spans alike. Without an SDK the traceparent a
producer sends is still stored and handed to the worker as it came.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from sqlalchemy.ext.asyncio import AsyncEngine

from app.http import tracing
from app.http.tracing import valid_traceparent
from jobq_client import JobContext
from tests.api.client_helpers import running_service
from tests.polling import poll_until
from tests.workers import RunningWorker

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """The process's SDK provider (set once: the API refuses a second), exporting to memory."""
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    exporter = InMemorySpanExporter()
    processor = SimpleSpanProcessor(exporter)
    provider.add_span_processor(processor)
    try:
        yield exporter
    finally:
        processor.shutdown()  # exports nothing more; the provider outlives the test


def _named(finished: tuple[ReadableSpan, ...], name: str) -> ReadableSpan:
    [span] = [s for s in finished if s.name == name]
    return span


def _parent_id(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


def _ancestors(span: ReadableSpan, finished: tuple[ReadableSpan, ...]) -> list[int]:
    """The span ids above ``span``, nearest first (a span of another process ends the walk)."""
    by_id = {s.context.span_id: s for s in finished}
    chain: list[int] = []
    parent = _parent_id(span)
    while parent is not None:
        chain.append(parent)
        parent = _parent_id(by_id[parent]) if parent in by_id else None
    return chain


async def test_one_trace_runs_from_the_producer_through_jobq_to_the_handler(
    database_url: str, clean_db: AsyncEngine, spans: InMemorySpanExporter
) -> None:
    tracer = trace.get_tracer("test")
    handled = asyncio.Event()
    async with running_service(database_url) as service, service.client() as client:
        worker, _ = service.worker(queues=["traced"], wait_seconds=1.0)

        @worker.handler("invoice")
        async def invoice(ctx: JobContext) -> Any:
            with tracer.start_as_current_span("render invoice"):
                pass
            handled.set()
            return {"ok": True}

        with tracer.start_as_current_span("checkout", kind=SpanKind.SERVER) as checkout:
            job = await client.enqueue("invoice", {"order": 7}, queue="traced")
        trace_id = checkout.get_span_context().trace_id
        # The job keeps the service's enqueue span, a child of the producer's.
        assert job["traceparent"] is not None
        assert job["traceparent"].split("-")[1] == f"{trace_id:032x}"

        async with RunningWorker(worker):
            await asyncio.wait_for(handled.wait(), timeout=15)
            await poll_until(
                lambda: any(s.name == "settle traced" for s in spans.get_finished_spans()),
                within=10,
                what="the complete's span",
            )
        assert (await client.get_job(job["id"]))["status"] == "succeeded"

    finished = spans.get_finished_spans()
    send = _named(finished, "send traced")
    process = _named(finished, "process traced")
    render = _named(finished, "render invoice")
    settle = _named(finished, "settle traced")
    receive = [s for s in finished if s.name == "receive traced" and s.attributes is not None]
    claim = [s for s in receive if s.attributes.get("messaging.message.id") == str(job["id"])]

    # One trace: checkout -> send (jobq) -> process (worker) -> render, and process -> settle.
    for span in (send, process, render, settle):
        assert span.context.trace_id == trace_id, span.name
    # (httpx and FastAPI record spans of their own around each request when an SDK is set: an
    # ancestor, not necessarily the parent.)
    assert checkout.get_span_context().span_id in _ancestors(send, finished)
    assert _parent_id(process) == send.context.span_id
    assert _parent_id(render) == process.context.span_id
    assert process.context.span_id in _ancestors(settle, finished)

    # Named and attributed as the messaging conventions have it.
    assert send.kind == SpanKind.PRODUCER and process.kind == SpanKind.CONSUMER
    assert send.attributes is not None and process.attributes is not None
    assert send.attributes["messaging.system"] == "jobq"
    assert send.attributes["messaging.operation.type"] == "send"
    assert send.attributes["messaging.destination.name"] == "traced"
    assert send.attributes["messaging.message.id"] == str(job["id"])
    assert process.attributes["messaging.message.id"] == str(job["id"])
    assert settle.attributes is not None
    assert settle.attributes["messaging.operation.name"] == "complete"
    # The claim is the worker's own poll, linked to the job's producer rather than its child.
    [claimed] = claim
    assert claimed.kind == SpanKind.CLIENT
    assert [link.context.span_id for link in claimed.links] == [send.context.span_id]


async def test_a_failing_handler_marks_its_span_failed(
    database_url: str, clean_db: AsyncEngine, spans: InMemorySpanExporter
) -> None:
    tried = asyncio.Event()
    async with running_service(database_url) as service, service.client() as client:
        worker, _ = service.worker(queues=["traced"], wait_seconds=1.0)

        @worker.handler("broken")
        async def broken(ctx: JobContext) -> Any:
            tried.set()
            raise KeyError("currency")

        job = await client.enqueue("broken", queue="traced", max_attempts=1)
        async with RunningWorker(worker):
            await asyncio.wait_for(tried.wait(), timeout=15)
            await poll_until(
                lambda: any(s.name == "settle traced" for s in spans.get_finished_spans()),
                within=10,
                what="the fail's span",
            )
        assert (await client.get_job(job["id"]))["status"] == "dead"

    process = _named(spans.get_finished_spans(), "process traced")
    assert process.status.status_code == StatusCode.ERROR
    assert [e.attributes["exception.type"] for e in process.events if e.attributes] == ["KeyError"]


async def test_without_opentelemetry_the_callers_traceparent_is_kept_and_handed_out(
    database_url: str, clean_db: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As where the optional packages are not installed (another test may have set an SDK).
    monkeypatch.setattr(tracing, "trace", None)
    async with running_service(database_url) as service:
        http = service.transport()
        async with httpx.AsyncClient(transport=http, base_url="http://jobq.test") as api:
            headers = {"traceparent": TRACEPARENT}
            made = await api.post("/v1/jobs", json={"type": "t", "queue": "q"}, headers=headers)
            bad = await api.post(
                "/v1/jobs", json={"type": "t", "queue": "q"}, headers={"traceparent": "00-zz"}
            )
            batch = await api.post(
                "/v1/jobs/batch",
                json={"jobs": [{"type": "t", "queue": "q"}, {"type": "t", "queue": "q"}]},
                headers=headers,
            )
            claim = await api.post(
                "/v1/claim", json={"worker_id": "w", "queues": ["q"], "max_jobs": 10}
            )
    assert made.status_code == bad.status_code == batch.status_code == 201
    assert made.json()["traceparent"] == TRACEPARENT
    assert bad.json()["traceparent"] is None  # ignored, not refused
    assert [j["traceparent"] for j in batch.json()["jobs"]] == [TRACEPARENT] * 2
    handed = {j["id"]: j["traceparent"] for j in claim.json()["jobs"]}
    assert handed[made.json()["id"]] == made.json()["traceparent"]
    assert handed[bad.json()["id"]] is None


@pytest.mark.parametrize(
    ("value", "stored"),
    [
        (TRACEPARENT, TRACEPARENT),
        (TRACEPARENT.upper(), None),  # the recommendation's format is lower-case hex
        ("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-future", TRACEPARENT),
        ("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra", None),
        ("ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", None),
        ("00-00000000000000000000000000000000-00f067aa0ba902b7-01", None),
        ("00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01", None),
        ("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7", None),
        ("", None),
        (None, None),
    ],
)
def test_traceparent_is_read_as_the_w3c_recommendation_says(
    value: str | None, stored: str | None
) -> None:
    assert valid_traceparent(value) == stored
