"""Trace context across the queue, with OpenTelemetry when the application has it.

A producer's request carries the current span's context (``traceparent``), which jobq keeps with
the job; the worker runs each handler inside a ``process`` span whose parent is that context, and
its lease calls carry the handler's context, so one trace runs from the producer's span through
jobq to the handler and its own spans. Without ``opentelemetry-api`` installed every function
here does nothing; with the API but no SDK configured, the spans are the API's non-recording ones.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, MutableMapping
from typing import Any

try:
    from opentelemetry import propagate, trace
    from opentelemetry.trace import SpanKind
except ImportError:  # tracing is the application's choice, not a dependency of the client
    trace = None  # type: ignore[assignment]


def inject(headers: MutableMapping[str, str]) -> None:
    """Adds the current trace context (``traceparent``, ``tracestate``) to a request's headers."""
    if active():
        propagate.inject(headers)


def active() -> bool:
    """Whether a valid trace context is current (a request would carry a ``traceparent``)."""
    return trace is not None and trace.get_current_span().get_span_context().is_valid


@contextlib.contextmanager
def process_span(job: Mapping[str, Any]) -> Iterator[None]:
    """The span a handler runs in, continuing the trace the job was enqueued in."""
    if trace is None:
        yield
        return
    parent = job.get("traceparent")
    context = propagate.extract({"traceparent": parent}) if parent else None
    tracer = trace.get_tracer("jobq_client")
    queue = job.get("queue")
    with tracer.start_as_current_span(
        f"process {queue}",
        context=context,
        kind=SpanKind.CONSUMER,
        attributes={
            "messaging.system": "jobq",
            "messaging.operation.type": "process",
            "messaging.operation.name": "process",
            "messaging.destination.name": str(queue),
            "messaging.message.id": str(job.get("id")),
            "jobq.job.type": str(job.get("type")),
            "jobq.job.attempt": int(job.get("attempt") or 0),
        },
    ):
        yield


def record_failure(error: BaseException) -> None:
    """Marks the current (process) span failed with the handler's exception."""
    if trace is None:
        return
    span = trace.get_current_span()
    span.record_exception(error)
    span.set_status(trace.Status(trace.StatusCode.ERROR, type(error).__name__))
