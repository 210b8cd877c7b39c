"""Two ``jobq serve`` processes on one database, sixteen concurrent HTTP workers: each job runs once."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from typing import Any

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.acceptance.helpers import claim, enqueue_batch, job_rows, lease, lease_call
from tests.processes import JobqServers

pytestmark = pytest.mark.acceptance

QUEUE = "acceptance"
JOBS = 2000
BATCH = 500
WORKERS = 16
MAX_JOBS = 5
DEADLINE_SECONDS = 120.0


async def test_two_instances_sixteen_workers_complete_every_job_exactly_once(
    jobq_servers: JobqServers, clean_db: AsyncEngine
) -> None:
    servers = await asyncio.gather(jobq_servers.start(), jobq_servers.start())
    async with contextlib.AsyncExitStack() as stack:
        clients = [
            await stack.enter_async_context(httpx.AsyncClient(base_url=s.url, timeout=30.0))
            for s in servers
        ]

        # 2,000 jobs in four batches, split across both instances.
        batches = await asyncio.gather(
            *(
                enqueue_batch(clients[b % 2], QUEUE, [{"n": n} for n in range(lo, lo + BATCH)])
                for b, lo in enumerate(range(0, JOBS, BATCH))
            )
        )
        enqueued = [job["id"] for batch in batches for job in batch]
        assert len(set(enqueued)) == JOBS, "the batch endpoint answered duplicate ids"
        expected = set(enqueued)

        claimed: list[int] = []
        completed: list[int] = []
        not_ok: list[dict[str, Any]] = []
        completed_by: dict[int, str] = {}
        per_instance = Counter[int]()

        async def worker(index: int) -> None:
            worker_id = f"worker-{index:02d}"
            instance = index % 2
            client = clients[instance]
            while True:
                jobs = await claim(
                    client, worker_id, QUEUE, max_jobs=MAX_JOBS, lease_seconds=120, wait_seconds=0.5
                )
                if not jobs:
                    if len(completed) + len(not_ok) >= JOBS:
                        return
                    continue
                assert len(jobs) <= MAX_JOBS
                for job in jobs:
                    assert job["status"] == "running" and job["worker_id"] == worker_id, job
                    assert job["attempt"] == 1, job
                claimed.extend(job["id"] for job in jobs)
                results = await lease_call(
                    client,
                    "complete",
                    worker_id,
                    [lease(job, result={"worker": worker_id}) for job in jobs],
                )
                for res in results:
                    if res["ok"] is True and res["status"] == "succeeded":
                        completed.append(res["job_id"])
                        completed_by[res["job_id"]] = worker_id
                        per_instance[instance] += 1
                    else:
                        not_ok.append({**res, "worker_id": worker_id})

        try:
            async with asyncio.timeout(DEADLINE_SECONDS), asyncio.TaskGroup() as group:
                for index in range(WORKERS):
                    group.create_task(worker(index))
        except TimeoutError:
            pytest.fail(
                f"workers did not drain the queue within {DEADLINE_SECONDS} s: "
                f"{len(completed)} completed ok, {len(not_ok)} not ok, {len(claimed)} claimed"
            )

    assert not_ok == [], f"completions answered not ok: {not_ok[:10]}"

    claims = Counter(claimed)
    assert [i for i, n in claims.items() if n > 1] == [], "jobs claimed more than once"
    assert set(claims) == expected

    completions = Counter(completed)
    duplicates = sorted(i for i, n in completions.items() if n > 1)
    missing = sorted(expected - set(completions))
    unknown = sorted(set(completions) - expected)
    assert duplicates == [], f"jobs completed more than once: {duplicates[:20]}"
    assert missing == [], f"jobs never completed: {missing[:20]}"
    assert unknown == [], f"completed ids that were never enqueued: {unknown[:20]}"
    assert per_instance[0] > 0 and per_instance[1] > 0, per_instance

    rows = await job_rows(clean_db)
    assert set(rows) == expected
    assert Counter(row["status"] for row in rows.values()) == {"succeeded": JOBS}
    assert Counter(row["attempts"] for row in rows.values()) == {1: JOBS}
    wrong_owner = [
        job_id
        for job_id, row in rows.items()
        if row["worker_id"] != completed_by[job_id]
        or row["result"] != {"worker": completed_by[job_id]}
    ]
    assert wrong_owner == [], f"rows whose worker_id/result differ from the ack: {wrong_owner[:20]}"
