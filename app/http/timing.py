"""Request durations per route template, method and status class, measured around the whole app.

:class:`RequestTimer` is an outer ASGI wrapper (``JobqAPI.outer``), so it times the fast path
too. Labels stay few whatever clients send: the route is its template (``/v1/jobs/{job_id}``,
never ``/v1/jobs/42``), ``other`` when no route matched; an unusual method is ``other``.

The counts are plain numbers, no locks: the app runs on one event loop and scrapes read them on
that same loop. :class:`Histogram` is shared with the job metrics (app/api/metrics.py).
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Callable, Iterator, Sequence

from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Message, Receive, Scope, Send

# OpenTelemetry's advice for http.server.request.duration, up to the longest long poll (60 s).
REQUEST_BUCKETS: tuple[float, ...] = (
    0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 30, 60,
)  # fmt: skip
OTHER = "other"
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
_STATUS_CLASSES = ("none", "1xx", "2xx", "3xx", "4xx", "5xx")


class Histogram:
    """Observations counted in buckets (each bound inclusive, as Prometheus' ``le``) with their sum."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last: above every bound (+Inf)
        self.total = 0.0

    def observe(self, value: float) -> None:
        """Counts one observation."""
        self.counts[bisect_left(self.bounds, value)] += 1
        self.total += value

    def buckets(self) -> list[tuple[str, float]]:
        """Cumulative counts per upper bound, ``+Inf`` last, as the exposition wants them."""
        out: list[tuple[str, float]] = []
        running = 0
        for bound, count in zip((*map(str, self.bounds), "+Inf"), self.counts, strict=True):
            running += count
            out.append((bound, running))
        return out


class RequestDurations:
    """A histogram of request durations per (route template, method, status class)."""

    def __init__(self, bounds: Sequence[float] = REQUEST_BUCKETS) -> None:
        self.bounds = bounds
        self.by_labels: dict[tuple[str, str, str], Histogram] = {}

    def observe(self, route: str, method: str, status_class: str, seconds: float) -> None:
        """Counts one request."""
        key = (route, method, status_class)
        histogram = self.by_labels.get(key)
        if histogram is None:
            histogram = self.by_labels[key] = Histogram(self.bounds)
        histogram.observe(seconds)

    def __iter__(self) -> Iterator[tuple[tuple[str, str, str], Histogram]]:
        return iter(sorted(self.by_labels.items()))


def status_class(status: int) -> str:
    """``2xx`` for 204 and so on; ``none`` when no response was started."""
    return _STATUS_CLASSES[status // 100] if 100 <= status < 600 else _STATUS_CLASSES[0]


class RequestTimer:
    """ASGI wrapper: times each HTTP request until its response is sent, by route template.

    Paths without parameters (every hot route) are their own template, looked up in a set;
    for the others the template is the route the router matched, which Starlette leaves in
    the scope. ``on_startup`` is called once the app's lifespan has started.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        routes: Sequence[BaseRoute],
        durations: RequestDurations,
        on_startup: Callable[[], None] = lambda: None,
    ) -> None:
        self.app = app
        self.durations = durations
        self.on_startup = on_startup
        self.static = frozenset(
            path for r in routes if "{" not in (path := getattr(r, "path", "{"))
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            if scope["type"] == "lifespan":
                await self.app(scope, receive, self._lifespan_send(send))
                return
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 0

        async def timed_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, timed_send)
        finally:
            elapsed = time.perf_counter() - start
            method = scope["method"]
            self.durations.observe(
                self._route(scope),
                method if method in METHODS else OTHER,
                status_class(status),
                elapsed,
            )

    def _route(self, scope: Scope) -> str:
        path: str = scope["path"]
        if path in self.static:
            return path
        route = scope.get("route")
        template = getattr(route, "path", None)
        return template if isinstance(template, str) else OTHER

    def _lifespan_send(self, send: Send) -> Send:
        async def lifespan_send(message: Message) -> None:
            if message["type"] == "lifespan.startup.complete":
                self.on_startup()
            await send(message)

        return lifespan_send
