"""The claim's plan walks the partial index in order; it never sorts the backlog."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import asyncpg
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db import driver_dsn
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


def _rows_read(node: dict[str, Any]) -> float:
    """Rows a node of an analysed plan handled over all its loops, kept or filtered out."""
    kept_or_dropped = (
        node.get("Actual Rows", 0)
        + node.get("Rows Removed by Filter", 0)
        + node.get("Rows Removed by Join Filter", 0)
    )
    return float(kept_or_dropped * node.get("Actual Loops", 1))


async def _analysed_generic_plan(
    database_url: str, name: str, arguments: dict[str, Any]
) -> dict[str, Any]:
    """The statement's generic plan, run under EXPLAIN ANALYZE and rolled back."""
    sql, names = statement(name).positional
    conn = await asyncpg.connect(driver_dsn(database_url))
    try:
        await conn.execute("SET plan_cache_mode = force_generic_plan")
        await conn.execute(f"PREPARE probe AS {sql}")
        literals = []
        for parameter, bound in zip((await conn.prepare(sql)).get_parameters(), names, strict=True):
            kind = await conn.fetchval("SELECT format_type($1, NULL)", parameter.oid)
            literal = await conn.fetchval(
                f"SELECT quote_nullable(CAST($1 AS {kind}))", arguments[bound]
            )
            literals.append(f"CAST({literal} AS {kind})")
        claim = conn.transaction()
        await claim.start()
        try:
            raw = await conn.fetchval(
                f"EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE probe({', '.join(literals)})"
            )
        finally:
            await claim.rollback()  # measured only: nothing is kept
    finally:
        await conn.close()
    plan: dict[str, Any] = json.loads(raw)[0]["Plan"]
    return plan


async def test_the_limited_claims_generic_plan_reads_its_candidates_a_few_times_not_squared(
    clean_db: AsyncEngine, database_url: str
) -> None:
    """A generic plan guesses one row for each CTE. Seen in the bench (stale statistics after a
    TRUNCATE): joins of the candidates with themselves became nested loops, and a claim of 700
    jobs of 20 keys read 15.8 million rows (1.4 s). Each step now reads the candidates once,
    joined to the few rows they need: the whole claim reads a small multiple of both."""
    slots, keys = 700, 20
    async with clean_db.begin() as conn:
        # Statistics of empty tables, as after the TRUNCATE that precedes a load.
        await conn.execute(text("ANALYZE jobs"))
        await conn.execute(text("ANALYZE flow_state"))
        await conn.execute(
            text(
                "INSERT INTO flow_limits (scope, pattern, like_pattern, max_running) "
                "VALUES ('key', 'k*', 'k%', 1000000)"
            )
        )
        await conn.execute(
            text(
                "INSERT INTO jobs (queue, type, max_attempts, lease_seconds, concurrency_key) "
                "SELECT 'q0', 't', 10, 30, 'k' || (g % :keys) "
                "FROM generate_series(1, :n) AS g"
            ),
            {"keys": keys, "n": 3 * slots},
        )
        await conn.execute(
            text(
                "INSERT INTO flow_state (key) "
                "SELECT 'key:q0|k' || g FROM generate_series(0, :keys - 1) AS g"
            ),
            {"keys": keys},
        )
    arguments = {
        "queues": ["q0"],
        "max_jobs": slots,
        "window": 2,
        "worker_ids": ["w"] * slots,
        "key_ids": [None] * slots,
        "lease_seconds": [30] * slots,
        "instance": "test:1",
    }
    plan = await _analysed_generic_plan(database_url, "job_claim_limited", arguments)
    granted = plan["Actual Rows"]
    # The statement's own steps: joins, sorts and scans of its CTEs. Table scans are left out:
    # how many index entries the walk of jobs passes over depends on what earlier tests left.
    steps = [node for node in _nodes(plan) if "Relation Name" not in node]
    read = sum(_rows_read(node) for node in steps)
    assert granted == slots
    # The candidates (two a slot) against the 20 locked rows, a few times: about 200,000; the
    # candidates against themselves read 15.8 million before.
    candidates = 2 * slots
    largest = sorted(
        (
            (_rows_read(n), n["Node Type"], n.get("CTE Name") or n.get("Relation Name"))
            for n in _nodes(plan)
        ),
        key=lambda entry: entry[0],
        reverse=True,
    )[:8]
    assert read < 25 * candidates * keys, (read, largest)


@pytest.mark.parametrize("claim", ["job_claim", "job_claim_limited"])
async def test_the_lease_update_probes_each_picked_job_once(
    clean_db: AsyncEngine, database_url: str, claim: str
) -> None:
    """Statistics taken while no job was pending (a history of finished ones) make a generic
    plan guess one picked job. Joined to the picked rows, the lease UPDATE then probed the
    primary key for every picked id once per picked job: 1,275 rows for a claim of 50. It
    now probes them once, whatever the guess."""
    slots = 50
    async with clean_db.begin() as conn:
        await conn.execute(
            text(
                "INSERT INTO jobs (queue, type, status, max_attempts, lease_seconds, "
                "finished_at) SELECT 'q0', 't', 'succeeded', 10, 30, now() "
                "FROM generate_series(1, 5000)"
            )
        )
        await conn.execute(text("ANALYZE jobs"))
        if claim == "job_claim_limited":
            await conn.execute(
                text(
                    "INSERT INTO flow_limits (scope, pattern, like_pattern, max_running) "
                    "VALUES ('key', 'k*', 'k%', 1000000)"
                )
            )
            await conn.execute(text("INSERT INTO flow_state (key) VALUES ('key:q0|k1')"))
    await seed_jobs(clean_db, 1000, queue="q0", concurrency_key="k1")
    arguments = {
        "queues": ["q0"],
        "max_jobs": slots,
        "window": 1,
        "worker_ids": ["w"] * slots,
        "key_ids": [None] * slots,
        "lease_seconds": [30] * slots,
        "instance": "test:1",
    }
    plan = await _analysed_generic_plan(database_url, claim, arguments)
    leased = [n for n in _nodes(plan) if n.get("CTE Name") == "claimed"]
    updates = [
        n
        for n in _nodes(plan)
        if n["Node Type"] == "ModifyTable" and n.get("Relation Name") == "jobs"
    ]
    assert leased and len(updates) == 1 and updates[0]["Actual Rows"] == slots
    probes = [
        n
        for n in _nodes(updates[0])
        if n.get("Index Name") == "pk_jobs" or n["Node Type"] == "Seq Scan"
    ]
    read = sum(_rows_read(n) for n in probes)
    assert probes and read <= slots, json.dumps(updates[0], indent=1)
