"""``GET /metrics``: this instance's figures in Prometheus' text format.

Each app has its own figures (several apps may share a process, as in the tests):

- job events per queue, and queue wait and run time histograms, counted by an observer of the
  service (:class:`JobMetrics`): a dictionary increment per event, no locks, no I/O;
- request durations per route template, timed by the outer wrapper (app/http/timing.py);
- queue depth per state and the oldest pending job's age, as the metrics loop last read them
  (app/maintenance/gauges.py): a scrape costs the database nothing;
- long-poll waiters, leadership, each loop's health and the hot statements, read from the
  runtime when scraped.

A key scoped to some queues sees only those queues' per-queue series; the instance-wide ones
(requests, loops, statements) it sees as any viewer does. docs/operating/metrics.md lists every metric.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import platform
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Annotated

from fastapi import APIRouter, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from starlette.applications import Starlette
from starlette.types import ASGIApp

from app.api.auth import requires
from app.api.state import AppState
from app.auth.keys import Permission, Principal
from app.domain.types import JobEvent
from app.http.timing import Histogram, RequestDurations, RequestTimer
from app.maintenance.gauges import QueueGauges

# Queue wait and run time: from a few milliseconds to hours.
JOB_BUCKETS: tuple[float, ...] = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600,
)  # fmt: skip
STATES = ("waiting", "scheduled", "pending", "running", "succeeded", "dead", "cancelled")


# The ``type`` label of a job type past the cap (JOBQ_METRICS_TYPES_MAX), and of an event whose
# statement did not read the type (a bulk action's).
OTHER_TYPE = "other"


class JobMetrics:
    """A subscriber of the job events: counts them per (queue, type, kind) and times waits and
    runs per queue. The first ``types_max`` job types seen get a label of their own."""

    def __init__(self, *, types_max: int = 50) -> None:
        self.events: Counter[tuple[str, str, str]] = Counter()
        self.waits: dict[str, Histogram] = {}
        self.runs: dict[str, Histogram] = {}
        self.types_max = types_max
        self.types: set[str] = set()

    def _type(self, name: str | None) -> str:
        if name is None:
            return OTHER_TYPE
        if name in self.types:
            return name
        if len(self.types) < self.types_max:
            self.types.add(name)
            return name
        return OTHER_TYPE

    def __call__(self, events: Sequence[JobEvent]) -> None:
        """Counts committed events (called after each commit, app/queue/events.py; never blocks)."""
        counts = self.events
        for event in events:
            counts[(event.queue, self._type(event.type), event.kind)] += 1
            if event.waited_seconds is not None:
                _observe(self.waits, event.queue, event.waited_seconds)
            if event.ran_seconds is not None:
                _observe(self.runs, event.queue, event.ran_seconds)


def _observe(histograms: dict[str, Histogram], queue: str, seconds: float) -> None:
    histogram = histograms.get(queue)
    if histogram is None:
        histogram = histograms[queue] = Histogram(JOB_BUCKETS)
    histogram.observe(seconds)


class AppMetrics:
    """One app's figures: the job observer, the request timer's durations, the scrape."""

    def __init__(self, state: AppState) -> None:
        self.state = state
        self.jobs = JobMetrics(types_max=state.settings.metrics_types_max)
        self.requests = RequestDurations()

    def timer(self, app: Starlette) -> Callable[[ASGIApp], ASGIApp]:
        """The outer wrapper for ``JobqAPI.outer``: times requests."""

        def wrap(inner: ASGIApp) -> ASGIApp:
            return RequestTimer(inner, routes=app.router.routes, durations=self.requests)

        return wrap

    def router(self) -> APIRouter:
        """The metrics route."""
        router = APIRouter()

        @router.get("/metrics", include_in_schema=False)
        async def metrics(caller: Annotated[Principal, requires(Permission.OBSERVE)]) -> Response:
            """Prometheus text format (viewer and admin keys; a scoped key sees its queues)."""
            return Response(generate_latest(_Scrape(self, caller)), media_type=CONTENT_TYPE_LATEST)

        return router


class _Scrape(Collector):
    """One scrape's families, limited to what the caller's key may see."""

    def __init__(self, metrics: AppMetrics, caller: Principal) -> None:
        self.metrics = metrics
        self.caller = caller
        self._covers: dict[str, bool] = {}

    def visible(self, queue: str) -> bool:
        """Whether the caller's scopes include this queue (remembered for the scrape)."""
        seen = self._covers.get(queue)
        if seen is None:
            seen = self._covers[queue] = self.caller.covers(queue)
        return seen

    def collect(self) -> Iterator[Metric]:
        """Every family: jobs, queues, requests, then the runtime's."""
        yield _build_info()
        yield from self._jobs()
        yield from self._queues()
        yield from self._limits_and_schedules()
        yield _request_family(self.metrics.requests)
        yield from self._runtime()

    def _jobs(self) -> Iterator[Metric]:
        jobs = self.metrics.jobs
        events = CounterMetricFamily(
            "jobq_job_events",
            "Committed job state changes per queue, job type and event (enqueued, claimed, "
            "completed, failed, dead, released, reaped, cancelled, retried); job types past "
            'JOBQ_METRICS_TYPES_MAX count as "other".',
            labels=["queue", "type", "event"],
        )
        for (queue, job_type, kind), count in sorted(jobs.events.items()):
            if self.visible(queue):
                events.add_metric([queue, job_type, kind], count)
        yield events
        yield self._histogram(
            "jobq_job_wait_duration_seconds",
            "Seconds from a job's run_at to its claim, per queue (PostgreSQL's times).",
            jobs.waits,
        )
        yield self._histogram(
            "jobq_job_run_duration_seconds",
            "Seconds from a claim to the complete or fail that ended the attempt, per queue.",
            jobs.runs,
        )

    def _histogram(
        self, name: str, documentation: str, histograms: dict[str, Histogram]
    ) -> HistogramMetricFamily:
        family = HistogramMetricFamily(name, documentation, labels=["queue"])
        for queue, histogram in sorted(histograms.items()):
            if self.visible(queue):
                family.add_metric([queue], histogram.buckets(), histogram.total)
        return family

    def _queues(self) -> Iterator[Metric]:
        runtime = self.metrics.state.runtime
        gauges = _gauges_loop(runtime.runner.loops) if runtime is not None else None
        rows = [r for r in (gauges.queues or ()) if self.visible(r.name)] if gauges else []
        depth = GaugeMetricFamily(
            "jobq_queue_jobs",
            "Jobs per queue and state, as the metrics loop last read them.",
            labels=["queue", "state"],
        )
        oldest = GaugeMetricFamily(
            "jobq_queue_oldest_pending_age_seconds",
            "Age of the queue's oldest pending job (since its run_at; 0 when none), as last read.",
            labels=["queue"],
        )
        paused = GaugeMetricFamily(
            "jobq_queue_paused", "1 while the queue is paused, as last read.", labels=["queue"]
        )
        for row in rows:
            for state in STATES:
                depth.add_metric([row.name, state], getattr(row, state))
            oldest.add_metric([row.name], row.oldest_pending_age_seconds or 0.0)
            paused.add_metric([row.name], int(row.paused))
        yield depth
        yield oldest
        yield paused
        errored = GaugeMetricFamily(
            "jobq_schedules_errored",
            "Schedules of the queue in error (parked: they enqueue nothing until changed or "
            "resumed), as last read.",
            labels=["queue"],
        )
        for queue, count in sorted((gauges.schedules_errored if gauges else {}).items()):
            if self.visible(queue):
                errored.add_metric([queue], count)
        yield errored
        set_aside = GaugeMetricFamily(
            "jobq_maintenance_set_aside",
            "Jobs a maintenance loop (reaper, promoter, pruner) could not move even alone and "
            "leaves out of its batches until an operator puts them back (GET "
            "/v1/maintenance/set-aside), as last read. Alert on any.",
            labels=["loop", "queue"],
        )
        for (loop, queue), count in sorted((gauges.set_aside if gauges else {}).items()):
            if self.visible(queue):
                set_aside.add_metric([loop, queue], count)
        yield set_aside

    def _limits_and_schedules(self) -> Iterator[Metric]:
        runtime = self.metrics.state.runtime
        gauges = _gauges_loop(runtime.runner.loops) if runtime is not None else None
        running = GaugeMetricFamily(
            "jobq_limit_running",
            "Jobs running under a concurrency or rate limit now, per limit, as last read.",
            labels=["scope", "pattern"],
        )
        maximum = GaugeMetricFamily(
            "jobq_limit_max_running",
            "A limit's max_running (limits with a rate only are left out).",
            labels=["scope", "pattern"],
        )
        held = GaugeMetricFamily(
            "jobq_limit_held_back",
            "Pending jobs held back by a limit now: in keys or queues at their max_running or "
            "with an empty rate bucket (counted up to 100,000 per key), as last read.",
            labels=["scope", "pattern"],
        )
        # A limit may reach any queue: only keys without scopes see them (as GET /v1/limits).
        if gauges is not None and not self.caller.scoped:
            held_back = gauges.held_back
            for limit in gauges.limits or ():
                labels = [limit.scope, limit.pattern]
                running.add_metric(labels, limit.running)
                if limit.max_running is not None:
                    maximum.add_metric(labels, limit.max_running)
                held.add_metric(labels, held_back.get(limit.id, 0))
        yield running
        yield maximum
        yield held
        next_run = GaugeMetricFamily(
            "jobq_schedule_next_run_timestamp_seconds",
            "Unix time of a schedule's next run, as last read.",
            labels=["schedule", "queue"],
        )
        last_run = GaugeMetricFamily(
            "jobq_schedule_last_run_timestamp_seconds",
            "Unix time of a schedule's last run enqueued (absent before its first).",
            labels=["schedule", "queue"],
        )
        state = GaugeMetricFamily(
            "jobq_schedule_errored",
            "1 while a schedule is in error (parked until changed or resumed), as last read.",
            labels=["schedule", "queue"],
        )
        for schedule in (gauges.schedules if gauges else None) or ():
            if not self.visible(schedule.queue):
                continue
            labels = [schedule.name, schedule.queue]
            next_run.add_metric(labels, schedule.next_run_at.timestamp())
            if schedule.last_run_at is not None:
                last_run.add_metric(labels, schedule.last_run_at.timestamp())
            state.add_metric(labels, int(schedule.errored_at is not None))
        yield next_run
        yield last_run
        yield state

    def _runtime(self) -> Iterator[Metric]:
        runtime = self.metrics.state.runtime
        if runtime is None:
            return
        yield GaugeMetricFamily(
            "jobq_claims_waiting",
            "Claims long-polling on this instance now.",
            value=runtime.hub.parked,
        )
        yield GaugeMetricFamily(
            "jobq_results_waiting",
            "Job reads waiting on this instance now for their job to finish.",
            value=runtime.services.results.hub.parked,
        )
        yield GaugeMetricFamily(
            "jobq_leader",
            "1 while this instance runs the leader-only loops.",
            value=int(runtime.runner.is_leader),
        )
        failures = GaugeMetricFamily(
            "jobq_loop_consecutive_failures",
            "Batches failed in a row, per loop (0 after a batch that succeeded).",
            labels=["loop"],
        )
        stalled = GaugeMetricFamily(
            "jobq_loop_stalled", "1 while a loop this instance runs is stalled.", labels=["loop"]
        )
        progress = GaugeMetricFamily(
            "jobq_loop_last_success_timestamp_seconds",
            "Unix time a loop running here last finished a batch (or started, before its first).",
            labels=["loop"],
        )
        stalled_now = set(runtime.runner.stalled())
        # The runner's clock is the event loop's (monotonic); shown as wall-clock time.
        offset = time.time() - asyncio.get_running_loop().time()
        for name, health in runtime.runner.health.items():
            failures.add_metric([name], health.failures)
            stalled.add_metric([name], int(name in stalled_now))
            if health.active:
                progress.add_metric([name], health.last_progress + offset)
        yield failures
        yield stalled
        yield progress
        statements = CounterMetricFamily(
            "jobq_statements",
            "Hot-path statements run, per kind; with coalescing, fewer than requests.",
            labels=["kind"],
        )
        for kind, count in sorted(runtime.services.unit.statements.items()):
            statements.add_metric([kind], count)
        yield statements


def _request_family(durations: RequestDurations) -> HistogramMetricFamily:
    family = HistogramMetricFamily(
        "jobq_http_server_request_duration_seconds",
        "Seconds from a request's arrival to its response sent, per route template, method and "
        "status class.",
        labels=["route", "method", "status_class"],
    )
    for labels, histogram in durations:
        family.add_metric(list(labels), histogram.buckets(), histogram.total)
    return family


def _build_info() -> GaugeMetricFamily:
    family = GaugeMetricFamily(
        "jobq_build_info",
        "Always 1: the jobq version and the Python this instance runs on.",
        labels=["version", "python"],
    )
    family.add_metric([_VERSION, platform.python_version()], 1)
    return family


def _version() -> str:
    try:
        return importlib.metadata.version("jobq")
    except importlib.metadata.PackageNotFoundError:  # run from a checkout without an install
        return "unknown"


_VERSION = _version()


def _gauges_loop(loops: Iterable[object]) -> QueueGauges | None:
    return next((loop for loop in loops if isinstance(loop, QueueGauges)), None)
