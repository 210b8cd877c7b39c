"""The claim's plan walks the partial index in order; it never sorts the backlog."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.store.statements import statement
from tests.integration.helpers import seed_jobs


def _nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from _nodes(child)


@pytest.mark.parametrize(
    ("claim", "window"), [("job_claim", 1), ("job_claim_limited", 1), ("job_claim_limited", 2)]
)
@pytest.mark.parametrize("queues", [["q0"], ["q0", "q1", "q2"]])
async def test_claim_uses_ordered_index_scan_without_backlog_sort(
    clean_db: AsyncEngine, queues: list[str], claim: str, window: int
) -> None:
    """The lean claim, and the one within limits with the wider window it reads while limits
    exist (window 2)."""
    for name in ("q0", "q1", "q2"):
        await seed_jobs(clean_db, 10_000 // 3 + 1, queue=name)
    async with clean_db.begin() as conn:
        await conn.execute(text("ANALYZE jobs"))
        await conn.execute(text("ANALYZE queues"))
        result = await conn.execute(
            text("EXPLAIN (FORMAT JSON) " + statement(claim).sql),
            {
                "queues": queues,
                "max_jobs": 10,
                "window": window,
                "worker_ids": ["w"] * 10,
                "key_ids": [None] * 10,
                "lease_seconds": [30] * 10,
                "instance": "test:1",
            },
        )
        raw = result.scalar_one()
        await conn.rollback()
    plan = (json.loads(raw) if isinstance(raw, str) else raw)[0]["Plan"]
    nodes = list(_nodes(plan))

    scans = [n for n in nodes if n.get("Relation Name") == "jobs" and "Scan" in n["Node Type"]]
    index_scans = [
        n
        for n in scans
        if n["Node Type"] == "Index Scan" and n.get("Index Name") == "ix_jobs_claimable"
    ]
    assert index_scans, json.dumps(plan, indent=1)
    assert not [n for n in scans if n["Node Type"] in ("Seq Scan", "Bitmap Heap Scan")]
    # Only the few candidates (max_jobs x window per queue) may be sorted, never the pending
    # rows. (Sorts above no scan of jobs order flow_state rows or the candidates' CTE.)
    for sort in (n for n in nodes if n["Node Type"] in ("Sort", "Incremental Sort")):
        if any(n.get("Relation Name") == "jobs" for n in _nodes(sort)):
            assert sort["Plan Rows"] <= 10 * window * len(queues), json.dumps(sort, indent=1)


async def test_the_limited_claim_reads_only_full_keys_of_many(clean_db: AsyncEngine) -> None:
    """With many idle keys in flow_state, the claim finds the full ones through the partial
    indexes and the others by primary key: no scan of flow_state grows with the keys."""
    await seed_jobs(clean_db, 1000, queue="q0", concurrency_key="k1")
    async with clean_db.begin() as conn:
        await conn.execute(
            text(
                "INSERT INTO flow_state (key, running, max_running) "
                "SELECT 'key:q0|k' || g, CASE WHEN g <= 5 THEN 1 ELSE 0 END, 1 "
                "FROM generate_series(1, 20000) AS g"
            )
        )
        await conn.execute(
            text(
                "INSERT INTO flow_limits (scope, pattern, like_pattern, max_running) "
                "VALUES ('key', 'k*', 'k%', 1)"
            )
        )
        await conn.execute(text("ANALYZE flow_state"))
        await conn.execute(text("ANALYZE jobs"))
        result = await conn.execute(
            text("EXPLAIN (FORMAT JSON) " + statement("job_claim_limited").sql),
            {
                "queues": ["q0"],
                "max_jobs": 10,
                "window": 2,
                "worker_ids": ["w"] * 10,
                "key_ids": [None] * 10,
                "lease_seconds": [30] * 10,
                "instance": "test:1",
            },
        )
        raw = result.scalar_one()
        await conn.rollback()
    plan = (json.loads(raw) if isinstance(raw, str) else raw)[0]["Plan"]
    flow_scans = [
        n
        for n in _nodes(plan)
        if n.get("Relation Name") == "flow_state" and "Scan" in n["Node Type"]
    ]
    assert flow_scans
    assert not [n for n in flow_scans if n["Node Type"] in ("Seq Scan", "Bitmap Heap Scan")], (
        json.dumps(flow_scans, indent=1)
    )
