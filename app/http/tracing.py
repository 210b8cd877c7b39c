"""Trace context: W3C ``traceparent`` in, kept with the job, and OpenTelemetry spans when wanted.

A producer's ``traceparent`` header is stored with its jobs and handed to the worker that claims
them, so the worker's handler joins the producer's trace. When an OpenTelemetry SDK is
configured in this process (``pip install 'jobq[otel]'`` and a tracer provider set, e.g. by
``opentelemetry-instrument jobq serve``), the service also records a span per enqueue, claim and
lease call, named and attributed after OpenTelemetry's messaging conventions (``send``,
``receive``, ``settle``; ``messaging.system`` is ``jobq``), and the job keeps the enqueue span's
context instead of the producer's, so the trace reads producer → jobq → worker.

Without the ``opentelemetry`` packages, or with no SDK configured (the API's default provider),
nothing is recorded or exported and a request pays one check per call.

An invalid ``traceparent`` is ignored, not refused: the W3C recommendation asks receivers to
start afresh rather than fail a request over a header a proxy or tracer wrote.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any

try:
    from opentelemetry import propagate, trace
    from opentelemetry.trace import Link, SpanKind
except ImportError:  # the optional extra is not installed
    trace = None  # type: ignore[assignment]

SYSTEM = "jobq"

# version-traceid-parentid-flags; a later version may append fields (read as version 00).
_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?")
_ZERO_TRACE = "0" * 32
_ZERO_SPAN = "0" * 16


def valid_traceparent(value: str | None) -> str | None:
    """``value`` as stored (version 00, lower case), or ``None`` when it is absent or invalid."""
    if value is None or len(value) > 512:
        return None
    match = _TRACEPARENT.fullmatch(value.strip())
    if match is None:
        return None
    version, trace_id, span_id, flags, rest = match.groups()
    if version == "ff" or (version == "00" and rest) or trace_id == _ZERO_TRACE:
        return None
    if span_id == _ZERO_SPAN:
        return None
    return f"00-{trace_id}-{span_id}-{flags}"


def _tracer() -> Any | None:
    """The tracer to record with, or ``None`` when no SDK is configured (nothing to record)."""
    if trace is None:
        return None
    provider = trace.get_tracer_provider()
    # The API's defaults until an SDK sets a provider: recording with them does nothing.
    if isinstance(provider, (trace.ProxyTracerProvider, trace.NoOpTracerProvider)):
        return None
    return provider.get_tracer("jobq")


def _traceparent_of(span: Any) -> str | None:
    context = span.get_span_context()
    if not context.is_valid:
        return None
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"


def _parent(traceparent: str | None) -> Any:
    """The context a span of a request starts in: the request's own span when some
    instrumentation already made one, else the caller's ``traceparent``."""
    if trace.get_current_span().get_span_context().is_valid or traceparent is None:
        return None  # the current context
    return propagate.extract({"traceparent": traceparent})


def _links(traceparents: Sequence[str | None]) -> list[Any]:
    links = []
    for value in traceparents:
        if value is None:
            continue
        context = trace.get_current_span(propagate.extract({"traceparent": value}))
        links.append(Link(context.get_span_context()))
    return links


class Span:
    """One request's span, or a stand-in that records nothing."""

    __slots__ = ("_span", "traceparent")

    def __init__(self, span: Any, traceparent: str | None) -> None:
        self._span = span
        # What the jobs of an enqueue keep: this span's context when recording, else the caller's.
        self.traceparent = traceparent if span is None else _traceparent_of(span)

    def set(self, name: str, value: Any) -> None:
        """Sets an attribute (nothing when not recording)."""
        if self._span is not None:
            self._span.set_attribute(name, value)

    def messages(self, ids: Sequence[int]) -> None:
        """Names the jobs the call touched: the job's id for one, the count for several."""
        if self._span is None:
            return
        if len(ids) == 1:
            self._span.set_attribute("messaging.message.id", str(ids[0]))
        else:
            self._span.set_attribute("messaging.batch.message_count", len(ids))

    def destination(self, queues: Iterable[str | None]) -> None:
        """Names the queue once known (a lease call learns it from the jobs it touched); read
        only when recording."""
        if self._span is None:
            return
        names = set(queues)
        if len(names) != 1 or (queue := names.pop()) is None:
            return
        self._span.set_attribute("messaging.destination.name", queue)
        verb = self._span.attributes.get("messaging.operation.type") or self._span.name
        self._span.update_name(f"{verb} {queue}")

    def link(self, traceparents: Sequence[str | None]) -> None:
        """Links the span to the jobs' producers (a claim's jobs each come from their own trace)."""
        if self._span is not None:
            for link in _links(traceparents):
                self._span.add_link(link.context)


class _Untraced(Span):
    """The stand-in when nothing records: a context manager of itself, no generator to run."""

    __slots__ = ()

    def __enter__(self) -> Span:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


def span(
    operation: str,
    kind: str,
    *,
    traceparent: str | None,
    queues: Sequence[str] = (),
    operation_type: str | None = None,
) -> AbstractContextManager[Span]:
    """A span for one jobq operation (``enqueue``, ``claim``, ``complete`` ...), as the messaging
    conventions name it: ``{operation type or name} {queue}``; recorded only with an SDK."""
    tracer = _tracer()
    if tracer is None:
        return _Untraced(None, traceparent)
    return _recorded(tracer, operation, kind, traceparent, queues, operation_type)


@contextmanager
def _recorded(
    tracer: Any,
    operation: str,
    kind: str,
    traceparent: str | None,
    queues: Sequence[str],
    operation_type: str | None,
) -> Iterator[Span]:
    destination = queues[0] if len(set(queues)) == 1 else None
    verb = operation_type or operation
    attributes: dict[str, Any] = {
        "messaging.system": SYSTEM,
        "messaging.operation.name": operation,
    }
    if operation_type is not None:
        attributes["messaging.operation.type"] = operation_type
    if destination is not None:
        attributes["messaging.destination.name"] = destination
    with tracer.start_as_current_span(
        f"{verb} {destination}" if destination is not None else verb,
        context=_parent(traceparent),
        kind=getattr(SpanKind, kind),
        attributes=attributes,
        record_exception=True,
        set_status_on_exception=True,
    ) as current:
        yield Span(current, traceparent)
