"""``GET /metrics``: this instance's figures in Prometheus' text format, read when scraped.

Each app has its own registry (several apps may share a process, as in the tests), filled by one
collector that reads the runtime at scrape time: nothing is counted on the hot path.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import APIRouter, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from app.api.auth import requires
from app.api.state import AppState
from app.auth.keys import Permission, Principal


class RuntimeCollector(Collector):
    """Long-poll waiters and the health of each background loop, as gauges."""

    def __init__(self, state: AppState) -> None:
        self.state = state

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        runtime = self.state.runtime
        if runtime is None:
            return
        yield GaugeMetricFamily(
            "jobq_claims_waiting",
            "Claims long-polling on this instance now.",
            value=runtime.hub.parked,
        )
        yield GaugeMetricFamily(
            "jobq_leader",
            "1 while this instance runs the leader-only loops.",
            value=int(runtime.runner.is_leader),
        )
        failures = GaugeMetricFamily(
            "jobq_loop_failures", "Batches failed in a row, per loop.", labels=["loop"]
        )
        stalled = GaugeMetricFamily(
            "jobq_loop_stalled", "1 while a loop this instance runs is stalled.", labels=["loop"]
        )
        stalled_now = set(runtime.runner.stalled())
        for name, health in runtime.runner.health.items():
            failures.add_metric([name], health.failures)
            stalled.add_metric([name], int(name in stalled_now))
        yield failures
        yield stalled
        statements = CounterMetricFamily(
            "jobq_statements",
            "Hot-path statements run, per kind; with coalescing, fewer than requests.",
            labels=["kind"],
        )
        for kind, count in sorted(runtime.service.statements.items()):
            statements.add_metric([kind], count)
        yield statements


def build_router(state: AppState) -> APIRouter:
    """The metrics route, with a registry of its own for this app."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(RuntimeCollector(state))
    router = APIRouter()

    @router.get("/metrics", include_in_schema=False)
    async def metrics(_caller: Annotated[Principal, requires(Permission.OBSERVE)]) -> Response:
        """Prometheus text format (viewer and admin keys; no per-queue series yet)."""
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    return router
