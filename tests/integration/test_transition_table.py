"""The transition table in app/domain/states.py says what the SQL does, state by state.

Each operation runs against a job in each state on a real database: where the table has an
entry the job must end in that state, elsewhere the operation must leave it alone. The backoff
ceiling the table module states is checked against ``jobq_backoff`` itself.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.domain.states import TRANSITIONS, JobStatus, Operation, backoff_ceiling
from app.domain.types import LeaseUpdate
from app.errors import InvalidTransition
from app.queue.services import Services
from tests.integration.helpers import job_row

FINAL = {Operation.FAIL_FINAL, Operation.REAP_FINAL}
REAPING = {Operation.REAP_RETRY, Operation.REAP_FINAL}


async def _seed(engine: AsyncEngine, status: JobStatus, operation: Operation) -> dict[str, Any]:
    """A job in ``status`` that held a lease by worker ``w``: only its state differs per case."""
    lease_id = uuid.uuid4()
    finished = status in (JobStatus.SUCCEEDED, JobStatus.DEAD, JobStatus.CANCELLED)
    async with engine.begin() as conn:
        job_id = (
            await conn.execute(
                text(
                    "INSERT INTO jobs (queue, type, status, attempts, max_attempts, lease_seconds, "
                    "  run_at, lease_id, worker_id, started_at, lease_expires_at, finished_at) "
                    "VALUES ('q', 't', :status, 1, :max_attempts, 30, now() - interval '1 s', "
                    "  :lease_id, 'w', now(), now() + make_interval(secs => :expires), "
                    "  CASE WHEN :finished THEN now() END) RETURNING id"
                ),
                {
                    "status": status.value,
                    "max_attempts": 1 if operation in FINAL else 5,
                    "lease_id": lease_id,
                    "expires": -1 if operation in REAPING else 60,
                    "finished": finished,
                },
            )
        ).scalar_one()
    return {"job_id": job_id, "lease_id": str(lease_id)}


def _runner(operation: Operation) -> Callable[[Services, dict[str, Any]], Awaitable[object]]:
    lease_calls: dict[Operation, tuple[str, dict[str, Any]]] = {
        Operation.COMPLETE: ("complete", {}),
        Operation.FAIL_RETRY: ("fail", {"error": "e"}),
        Operation.FAIL_RETRY_NOW: ("fail", {"error": "e", "retry_after_seconds": 0}),
        Operation.FAIL_FINAL: ("fail", {"error": "e", "retryable": False}),
        Operation.RELEASE: ("release", {}),
        Operation.RELEASE_DELAYED: ("release", {"delay_seconds": 60}),
    }
    if operation in lease_calls:
        name, fields = lease_calls[operation]

        async def lease_call(svc: Services, item: dict[str, Any]) -> object:
            return await getattr(svc.jobs, name)(
                worker_id="w", items=[LeaseUpdate(**{**item, **fields})]
            )

        return lease_call
    others: dict[Operation, Callable[[Services, dict[str, Any]], Awaitable[object]]] = {
        Operation.PROMOTE: lambda svc, _: svc.upkeep.promote(batch_size=10),
        Operation.CLAIM: lambda svc, _: svc.jobs.claim(
            worker_id="w2", queues=["q"], max_jobs=1, lease_seconds=30
        ),
        Operation.REAP_RETRY: lambda svc, _: svc.upkeep.reap(batch_size=10),
        Operation.REAP_FINAL: lambda svc, _: svc.upkeep.reap(batch_size=10),
        Operation.CANCEL: lambda svc, item: svc.ops.cancel(item["job_id"]),
        Operation.RETRY: lambda svc, item: svc.ops.retry(item["job_id"]),
        Operation.RUN_NOW: lambda svc, item: svc.ops.run_now(item["job_id"]),
    }
    return others[operation]


@pytest.mark.parametrize("status", list(JobStatus))
@pytest.mark.parametrize("operation", list(Operation))
async def test_the_sql_moves_each_state_as_the_table_says(
    clean_db: AsyncEngine, svc: Services, operation: Operation, status: JobStatus
) -> None:
    item = await _seed(clean_db, status, operation)
    with contextlib.suppress(InvalidTransition):  # cancel / retry refuse with a 409
        await _runner(operation)(svc, item)
    after = JobStatus((await job_row(clean_db, item["job_id"]))["status"])
    assert after == TRANSITIONS.get((operation, status), status)


@pytest.mark.parametrize("attempt", [0, 1, 2, 5, 12, 63, 10_000])
async def test_jobq_backoff_draws_within_the_stated_ceiling(
    clean_db: AsyncEngine, attempt: int
) -> None:
    ceiling = backoff_ceiling(attempt=attempt, base_seconds=1.5, cap_seconds=3600)
    async with clean_db.connect() as conn:
        low, high = (
            await conn.execute(
                text(
                    "SELECT min(d), max(d) FROM (SELECT EXTRACT(EPOCH FROM "
                    "jobq_backoff(:attempt, 1.5, 3600)) AS d FROM generate_series(1, 2000)) s"
                ),
                {"attempt": attempt},
            )
        ).one()
    assert low > 0 and high <= ceiling
    assert high > ceiling * 0.9  # full jitter reaches up to the ceiling
