"""What ``python -m bench.deadrows`` reads from PostgreSQL around a workload, and the per-job sums.

A :class:`Snapshot` holds, for one database, every user table's cumulative counters from
``pg_stat_user_tables`` (inserts, updates, HOT updates, deletes; dead and live tuples now), the
heap's and each index's size, and the server's WAL position. :func:`table_rows` and
:func:`index_rows` turn two snapshots into per-job figures. :func:`statement_rows` groups
``pg_stat_statements`` rows (when the extension is loaded) by statement kind: the store's named
statements are recognised by their text (``app/store/sql/*.sql``), the statements trigger
functions run (``toplevel`` false) by the function whose body holds them.

The cumulative counters reach the shared statistics only when a backend flushes them (at most
once a second, and an idle backend waits up to 10 s; or when it exits): :func:`settled` polls
until the counts a workload must have left are visible and two reads in a row agree.
"""

from __future__ import annotations

import asyncio
import re
import time
from dataclasses import dataclass, field
from typing import Any

COUNTERS = ("n_tup_ins", "n_tup_upd", "n_tup_hot_upd", "n_tup_del", "n_dead_tup", "n_live_tup")

TABLES = """
SELECT relname, n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del, n_dead_tup, n_live_tup,
       pg_relation_size(relid) AS heap_bytes
FROM pg_stat_user_tables
"""
INDEXES = """
SELECT relname, indexrelname, pg_relation_size(indexrelid) AS bytes FROM pg_stat_user_indexes
"""
WAL_POSITION = "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint"
STATEMENTS = """
SELECT toplevel, query, calls, rows, wal_bytes::bigint AS wal_bytes, shared_blks_dirtied
FROM pg_stat_statements
WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
"""
FUNCTIONS = """
SELECT p.proname, p.prosrc FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
WHERE n.nspname NOT IN ('pg_catalog', 'information_schema') AND p.prolang <> 12 AND p.prolang <> 13
"""
# The orchestrator's own reads: kept in the JSON, left out of the printed kinds.
BENCH_MARKERS = ("pg_stat_", "txid_current", "pg_current_wal_lsn", "pg_relation_size", "pg_proc")

SETTLE_POLL_SECONDS = 0.25
SETTLE_TIMEOUT_SECONDS = 40.0


@dataclass
class Snapshot:
    """One database's table counters, relation sizes and the server's WAL position."""

    tables: dict[str, dict[str, int]] = field(default_factory=dict)
    indexes: dict[str, tuple[str, int]] = field(default_factory=dict)  # index -> (table, bytes)
    wal: int = 0


async def flush_own(conn: Any) -> None:
    """Asks this backend to flush its pending statistics (PostgreSQL 15+) and drops its cached
    view of them, so the next read sees what every exited or flushed backend reported."""
    if int(await conn.fetchval("SHOW server_version_num")) >= 150000:
        await conn.execute("SELECT pg_stat_force_next_flush()")
    await conn.execute("SELECT pg_stat_clear_snapshot()")


async def wal_position(conn: Any) -> int:
    """The server's WAL insert position in bytes."""
    value: int = await conn.fetchval(WAL_POSITION)
    return value


async def snapshot(conn: Any) -> Snapshot:
    """The counters and sizes as the shared statistics show them now."""
    await flush_own(conn)
    shot = Snapshot(wal=await wal_position(conn))
    for row in await conn.fetch(TABLES):
        shot.tables[row["relname"]] = {
            **{name: int(row[name]) for name in COUNTERS},
            "heap_bytes": int(row["heap_bytes"]),
        }
    for row in await conn.fetch(INDEXES):
        shot.indexes[row["indexrelname"]] = (row["relname"], int(row["bytes"]))
    return shot


async def settled(conn: Any, *, table: str, inserts: int, updates: int) -> Snapshot:
    """A snapshot taken once ``table`` shows at least ``inserts`` and ``updates`` and two reads
    in a row agree; raises ``TimeoutError`` after :data:`SETTLE_TIMEOUT_SECONDS`."""
    deadline = time.monotonic() + SETTLE_TIMEOUT_SECONDS
    previous: dict[str, dict[str, int]] | None = None
    while True:
        shot = await snapshot(conn)
        counts = shot.tables.get(table, {})
        enough = counts.get("n_tup_ins", 0) >= inserts and counts.get("n_tup_upd", 0) >= updates
        if enough and shot.tables == previous:
            return shot
        previous = shot.tables
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"{table}'s statistics show {counts} after {SETTLE_TIMEOUT_SECONDS:g} s, "
                f"expected at least {inserts} inserts and {updates} updates"
            )
        await asyncio.sleep(SETTLE_POLL_SECONDS)


def _per_job(value: float, jobs: int) -> float:
    return value / jobs if jobs else 0.0


def table_rows(before: Snapshot, after: Snapshot, jobs: int) -> list[dict[str, Any]]:
    """Per table written during the workload: inserts, updates, HOT updates, deletes per job
    (differences of the cumulative counters), HOT share of the updates, dead tuples per job at
    the end (the count then, not a difference), heap growth per job; busiest table first."""
    rows: list[dict[str, Any]] = []
    for name, end in after.tables.items():
        start = before.tables.get(name, dict.fromkeys((*COUNTERS, "heap_bytes"), 0))
        delta = {
            key: end[key] - start[key]
            for key in ("n_tup_ins", "n_tup_upd", "n_tup_hot_upd", "n_tup_del")
        }
        if not any(delta.values()) and end["n_dead_tup"] == start["n_dead_tup"]:
            continue  # not written during the workload
        updates = delta["n_tup_upd"]
        rows.append(
            {
                "table": name,
                "inserts": delta["n_tup_ins"],
                "updates": updates,
                "hot_updates": delta["n_tup_hot_upd"],
                "deletes": delta["n_tup_del"],
                "dead_end": end["n_dead_tup"],
                "live_end": end["n_live_tup"],
                "ins_per_job": _per_job(delta["n_tup_ins"], jobs),
                "upd_per_job": _per_job(updates, jobs),
                "hot_per_job": _per_job(delta["n_tup_hot_upd"], jobs),
                "hot_pct": 100.0 * delta["n_tup_hot_upd"] / updates if updates else None,
                "del_per_job": _per_job(delta["n_tup_del"], jobs),
                # Each update and each delete leaves one dead version, whatever vacuum did since.
                "made_dead_per_job": _per_job(updates + delta["n_tup_del"], jobs),
                "dead_per_job": _per_job(end["n_dead_tup"], jobs),
                "heap_growth_per_job": _per_job(end["heap_bytes"] - start["heap_bytes"], jobs),
            }
        )
    rows.sort(
        key=lambda r: (-(r["updates"] + r["inserts"] + r["deletes"] + r["dead_end"]), r["table"])
    )
    return rows


def totals(rows: list[dict[str, Any]], jobs: int) -> dict[str, Any]:
    """The sum over the tables of :func:`table_rows`, per job."""
    summed = {
        key: sum(r[key] for r in rows)
        for key in ("inserts", "updates", "hot_updates", "deletes", "dead_end")
    }
    return {
        "table": "all tables",
        **summed,
        "ins_per_job": _per_job(summed["inserts"], jobs),
        "upd_per_job": _per_job(summed["updates"], jobs),
        "hot_per_job": _per_job(summed["hot_updates"], jobs),
        "hot_pct": 100.0 * summed["hot_updates"] / summed["updates"] if summed["updates"] else None,
        "del_per_job": _per_job(summed["deletes"], jobs),
        "made_dead_per_job": _per_job(summed["updates"] + summed["deletes"], jobs),
        "dead_per_job": _per_job(summed["dead_end"], jobs),
    }


def index_rows(before: Snapshot, after: Snapshot, jobs: int) -> list[dict[str, Any]]:
    """Each index's size at the end and its growth per job over the workload, largest first."""
    rows: list[dict[str, Any]] = []
    for name, (table, size) in after.indexes.items():
        grown = size - before.indexes.get(name, (table, 0))[1]
        rows.append(
            {"table": table, "index": name, "bytes": size, "growth_per_job": _per_job(grown, jobs)}
        )
    rows.sort(key=lambda r: (-r["bytes"], r["index"]))
    return rows


def shape(sql: str) -> str:
    """``sql`` as ``pg_stat_statements`` would show it, reduced so both compare: constants and
    parameters as ``?``, comments gone, blanks collapsed, lower case."""
    text = re.sub(r"--[^\n]*", " ", sql)
    text = re.sub(r"'(?:[^']|'')*'", "?", text)
    text = re.sub(r"\$\d+", "?", text)
    text = re.sub(r"(?<![\w.])\d+(?:\.\d+)?\b", "?", text)
    return re.sub(r"\s+", " ", text).strip().lower()


def _common_prefix(a: str, b: str) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


# Shared by enough of a named statement's text to name it; the longest such match wins.
MIN_PREFIX = 60


def name_of(query: str, named: dict[str, str]) -> str | None:
    """The named statement (name -> :func:`shape` of its SQL) ``query`` is, or None."""
    wanted = shape(query)
    best, best_length = None, MIN_PREFIX - 1
    for name, text in named.items():
        if text == wanted:
            return name
        length = _common_prefix(text, wanted)
        if length > best_length:
            best, best_length = name, length
    return best


def family_of(name: str) -> str:
    """The kind of work a named statement does, as the report groups them."""
    if name.startswith("job_claim"):
        return "claim"
    if name.startswith("job_complete"):
        return "complete"
    if name.startswith(("job_enqueue", "enqueue_", "job_get_by_idempotency")):
        return "enqueue"
    maintenance = ("job_reap", "job_promote", "job_prune", "set_aside", "queue_counts_fold", "counter_journal",
                   "queue_throughput", "worker_", "jobs_analyze", "maintenance_", "health_",
                   "wakeup_", "schedule", "webhook", "audit", "key")  # fmt: skip
    if name.startswith(maintenance):
        return "maintenance"
    return "other"


def function_of(query: str, functions: dict[str, str]) -> str | None:
    """The function (name -> :func:`shape` of its body) whose body holds ``query``."""
    wanted = shape(query)[:80]
    for name, body in sorted(functions.items()):
        if wanted and wanted in body:
            return name
    return None


def statement_rows(
    rows: list[dict[str, Any]],
    *,
    named: dict[str, str],
    functions: dict[str, str],
    jobs: int,
) -> list[dict[str, Any]]:
    """``pg_stat_statements`` rows labelled (statement or function name, kind) and per job.

    Top-level rows' figures include what the triggers they fired did; the nested rows (kind
    ``trigger: <function>`` or ``counters trigger: <function>``) show that share apart.
    """
    labelled = []
    for row in rows:
        query = row["query"]
        if row["toplevel"]:
            if any(marker in query for marker in BENCH_MARKERS):
                label, kind = query.strip().splitlines()[0][:60], "bench"
            else:
                label = name_of(query, named) or shape(query)[:60]
                kind = family_of(label) if label in named else "other"
        else:
            function = function_of(query, functions) or "?"
            label = f"{function}: {shape(query)[:50]}"
            if function == "jobq_counters_fold":
                kind = "counters fold"
            else:
                kind = "counters trigger" if "count" in function else "trigger"
        labelled.append(
            {
                "toplevel": bool(row["toplevel"]),
                "label": label,
                "kind": kind,
                "calls": int(row["calls"]),
                "rows": int(row["rows"]),
                "wal_bytes": int(row["wal_bytes"]),
                "blks_dirtied": int(row["shared_blks_dirtied"]),
                "calls_per_job": _per_job(row["calls"], jobs),
                "rows_per_job": _per_job(row["rows"], jobs),
                "wal_per_job": _per_job(row["wal_bytes"], jobs),
                "dirtied_per_job": _per_job(row["shared_blks_dirtied"], jobs),
            }
        )
    labelled.sort(key=lambda r: -r["wal_bytes"])
    return labelled


def kind_rows(statements: list[dict[str, Any]], jobs: int) -> list[dict[str, Any]]:
    """:func:`statement_rows` summed per (top level or nested, kind), the bench's own left out."""
    groups: dict[tuple[bool, str], dict[str, Any]] = {}
    for row in statements:
        if row["kind"] == "bench":
            continue
        key = (row["toplevel"], row["kind"])
        group = groups.setdefault(
            key,
            {"toplevel": row["toplevel"], "kind": row["kind"], "calls": 0, "rows": 0,
             "wal_bytes": 0, "blks_dirtied": 0},
        )  # fmt: skip
        for name in ("calls", "rows", "wal_bytes", "blks_dirtied"):
            group[name] += row[name]
    out = []
    for group in groups.values():
        out.append(
            {
                **group,
                "calls_per_job": _per_job(group["calls"], jobs),
                "rows_per_job": _per_job(group["rows"], jobs),
                "wal_per_job": _per_job(group["wal_bytes"], jobs),
                "dirtied_per_job": _per_job(group["blks_dirtied"], jobs),
            }
        )
    out.sort(key=lambda r: (not r["toplevel"], -r["wal_bytes"]))
    return out
