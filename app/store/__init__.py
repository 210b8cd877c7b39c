"""The only package that runs SQL: one store per file of ``sql/``, one method per statement.

Each store method takes a :class:`~app.store.conn.Conn` (either driver) first and keyword
arguments after it; callers own the transaction. :func:`stores_for` builds the set of stores a
process uses from its settings.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from typing import Protocol

from app.domain.types import BackoffPolicy
from app.store.audit import AuditStore
from app.store.control import ControlStore
from app.store.flow_limits import FlowLimitStore
from app.store.job_events import JobEventStore
from app.store.jobs import JobStore
from app.store.keys import KeyStore
from app.store.maintenance import MaintenanceStore
from app.store.producers import ProducerStore
from app.store.queues import QueueStore
from app.store.schedules import ScheduleStore
from app.store.webhooks import WebhookStore
from app.store.workers import WorkerStore
from app.store.workflows import WorkflowStore


@dataclass(frozen=True, slots=True)
class Stores:
    """Every store, built once per process and handed to the services that need them."""

    jobs: JobStore
    job_events: JobEventStore
    queues: QueueStore
    flow_limits: FlowLimitStore
    schedules: ScheduleStore
    audit: AuditStore
    keys: KeyStore
    control: ControlStore
    workers: WorkerStore
    producers: ProducerStore
    workflows: WorkflowStore
    webhooks: WebhookStore
    maintenance: MaintenanceStore


# The store class of each SQL file (by its stem): what the mapping test walks.
STORE_OF_FILE: dict[str, type] = {
    "jobs": JobStore,
    "job_events": JobEventStore,
    "queues": QueueStore,
    "flow_limits": FlowLimitStore,
    "schedules": ScheduleStore,
    "audit": AuditStore,
    "keys": KeyStore,
    "control": ControlStore,
    "workers": WorkerStore,
    "producers": ProducerStore,
    "workflows": WorkflowStore,
    "webhooks": WebhookStore,
    "maintenance": MaintenanceStore,
}


class StoreSettings(Protocol):
    """The settings the stores read (``app.settings.Settings`` has them; the store sits below it)."""

    @property
    def backoff_base_seconds(self) -> float: ...
    @property
    def backoff_cap_seconds(self) -> float: ...
    @property
    def errors_kept(self) -> int: ...
    @property
    def error_text_max_chars(self) -> int: ...
    @property
    def instance_name(self) -> str | None: ...


def stores_for(settings: StoreSettings) -> Stores:
    """The stores for a process with these settings (backoff policy, the instance's name)."""
    backoff = BackoffPolicy(
        base_seconds=settings.backoff_base_seconds,
        cap_seconds=settings.backoff_cap_seconds,
        errors_kept=settings.errors_kept,
        error_max_chars=settings.error_text_max_chars,
    )
    instance = settings.instance_name or f"{socket.gethostname()}:{os.getpid()}"
    return Stores(
        jobs=JobStore(backoff=backoff, instance=instance),
        job_events=JobEventStore(),
        queues=QueueStore(),
        flow_limits=FlowLimitStore(),
        schedules=ScheduleStore(),
        audit=AuditStore(),
        keys=KeyStore(),
        control=ControlStore(),
        workers=WorkerStore(instance=instance),
        producers=ProducerStore(),
        workflows=WorkflowStore(),
        webhooks=WebhookStore(instance=instance),
        maintenance=MaintenanceStore(backoff=backoff),
    )
