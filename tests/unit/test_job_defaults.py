"""JobDefaults.apply fills in what a job left out and keeps every other field as it came."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime

from app.domain.types import JobDefaults, NewJob


def test_apply_keeps_every_field_it_does_not_fill_in() -> None:
    # A value for every field, each unlike its default: a field apply forgets shows up here.
    job = NewJob(
        queue="q",
        type="t",
        payload={"a": 1},
        priority=5,
        run_at=datetime(2030, 1, 1, tzinfo=UTC),
        delay_seconds=None,
        max_attempts=None,
        lease_seconds=None,
        timeout_seconds=60,
        idempotency_key="k",
        fingerprint="f",
        concurrency_key="c",
        traceparent="00-" + "1" * 32 + "-" + "2" * 16 + "-01",
        depends_on=(1, 2),
        on_parent_failure="run",
        ordering_key="o",
        id=7,
        workflow_id=3,
        workflow_step="s",
        has_dependents=True,
    )
    applied = JobDefaults(max_attempts=4, lease_seconds=9).apply(job)
    assert (applied.max_attempts, applied.lease_seconds) == (4, 9)
    for field in dataclasses.fields(NewJob):
        if field.name not in ("max_attempts", "lease_seconds"):
            assert getattr(applied, field.name) == getattr(job, field.name), field.name
