"""The services of one running instance, built once by the lifespan and composed, not mixed in.

Each service gets the unit of work, the stores and the events it needs, and none imports
another (an import-linter contract in pyproject.toml keeps it so). A new feature adds its
service here with one line.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.domain.types import JobDefaults
from app.queue.chained import ChainedClaims
from app.queue.events import Events, Wake
from app.queue.flow_limits import LimitsService
from app.queue.history import HistoryService
from app.queue.jobs import CoalescingPolicy, JobService
from app.queue.linked import ParentResultBounds
from app.queue.ops import OpsService
from app.queue.results import ResultHub, ResultService
from app.queue.schedule_trigger import ScheduleTriggerService
from app.queue.schedules import ScheduleService
from app.queue.upkeep import UpkeepService
from app.queue.waiters import WaiterHub
from app.queue.webhooks import WebhookService
from app.queue.workers import WorkerService
from app.queue.workflows import WorkflowService
from app.store import Stores
from app.store.unit import UnitOfWork


@dataclass(frozen=True)
class Services:
    """Every service of an instance, and what they share: the unit of work and the events."""

    unit: UnitOfWork
    events: Events
    jobs: JobService
    # complete / fail / release that claim the worker's next jobs in the same call
    chained: ChainedClaims
    results: ResultService
    ops: OpsService
    history: HistoryService
    limits: LimitsService
    schedules: ScheduleService
    schedule_trigger: ScheduleTriggerService
    upkeep: UpkeepService
    workers: WorkerService
    workflows: WorkflowService
    webhooks: WebhookService


def build_services(
    *,
    unit: UnitOfWork,
    stores: Stores,
    defaults: JobDefaults,
    coalescing: CoalescingPolicy | None = None,
    hub: WaiterHub | None = None,
    results: ResultHub | None = None,
    wake: Wake | None = None,
    bulk_batch_size: int = 1000,
    parent_results: ParentResultBounds | None = None,
) -> Services:
    """Builds the services on one unit of work (the engine and the driver pool under it).

    ``wake`` receives the wake-ups of committed changes (the control channel, which also wakes
    other instances); without it they go to ``hub``, this instance's parked claims.
    """
    hub = hub or WaiterHub()
    events = Events(wake or hub.notify)
    jobs = JobService(
        unit=unit,
        stores=stores,
        events=events,
        hub=hub,
        defaults=defaults,
        coalescing=coalescing,
        parent_results=parent_results,
    )
    return Services(
        unit=unit,
        events=events,
        jobs=jobs,
        chained=ChainedClaims(jobs),
        results=ResultService(unit=unit, stores=stores, hub=results or ResultHub()),
        ops=OpsService(unit=unit, stores=stores, events=events, bulk_batch_size=bulk_batch_size),
        history=HistoryService(unit=unit, stores=stores),
        limits=LimitsService(unit=unit, stores=stores, events=events),
        schedules=ScheduleService(unit=unit, stores=stores, events=events, defaults=defaults),
        schedule_trigger=ScheduleTriggerService(
            unit=unit, stores=stores, events=events, defaults=defaults
        ),
        upkeep=UpkeepService(unit=unit, stores=stores, events=events),
        workers=WorkerService(unit=unit, stores=stores),
        workflows=WorkflowService(unit=unit, stores=stores, events=events, defaults=defaults),
        webhooks=WebhookService(unit=unit, stores=stores, events=events),
    )
