"""``python -m bench.claimwalk``: what one claim costs as taken jobs pile up behind a held horizon.

    python -m bench.claimwalk                                  # embedded PostgreSQL
    python -m bench.claimwalk --dsn postgresql://postgres@127.0.0.1:5432/postgres
    python -m bench.claimwalk --dead 0,1000 --repeat 3         # a quick look

While a transaction with a transaction id stays open, no row version that died after it began
can be removed, by vacuum or by page pruning, and nor can the index entries that point at it.
A claim walks ``ix_jobs_claimable`` (queue, priority, run_at, id; pending rows only) from the
head of its queue, and the head is where the jobs already taken were: each of their old
versions still has its entry there, and the walk visits every one (an index entry, a heap
fetch, a visibility check) before it reaches a job it may take. So the cost of a claim grows
with how many jobs were taken since the hold began: at 1,000 jobs/s, 180,000 after 3 minutes.

This bench makes that count exact instead of waiting for it: a fresh migrated database, a
backlog of ``max(--dead) + 10,000`` pending jobs in one queue, a connection that holds
``BEGIN; SELECT txid_current()`` open, and then, for each count of ``--dead``, the head of the
queue taken (``UPDATE ... SET status = 'succeeded'`` of the next jobs in claim order, in
committed batches of 10,000) until that many taken jobs lie ahead of the first pending one.
At each count it runs ``EXPLAIN (ANALYZE, BUFFERS)`` of the service's own ``job_claim``
statement (app/store/sql/jobs.sql) for ``--max-jobs`` jobs ``--repeat`` times, each in a
transaction rolled back (an aborted version is dead to every snapshot, so it adds nothing to
the walk), and prints the median execution time and shared buffers touched, beside the same
numbers for a walk that starts at the first pending job's key (``(run_at, id) >=`` that key
within its priority: what a claim cursor would walk), as a lower bound for any remedy.
Speed is reported, never asserted; buffers do not depend on the machine's load, times do.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from typing import Any

import asyncpg

from app.store.statements import statement
from bench.harness import database, raw_dsn

QUEUE = "walk"
SPARE = 10_000  # pending jobs left after the largest count, so every claim finds work
BATCH = 10_000
DEAD = (0, 20_000, 60_000, 180_000)

INSERT = """
INSERT INTO jobs (queue, type, payload, max_attempts, lease_seconds)
SELECT $1, 'bench', jsonb_build_object('n', g), 3, 30 FROM generate_series(1, $2) AS g
"""
TAKE = """
UPDATE jobs SET status = 'succeeded', finished_at = now()
WHERE id IN (
    SELECT id FROM jobs WHERE queue = $1 AND status = 'pending'
    ORDER BY priority DESC, run_at, id LIMIT $2
)
"""
HEAD = """
SELECT priority, run_at, id FROM jobs WHERE queue = $1 AND status = 'pending'
ORDER BY priority DESC, run_at, id LIMIT 1
"""
CURSOR_WALK = """
SELECT id FROM jobs
WHERE queue = $1 AND status = 'pending' AND run_at <= now()
  AND priority = $2 AND (run_at, id) >= ($3, $4)
ORDER BY priority DESC, run_at, id
LIMIT $5
FOR UPDATE SKIP LOCKED
"""


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench.claimwalk", description=__doc__.split("\n")[0] if __doc__ else None
    )
    p.add_argument("--dsn", help="PostgreSQL server to use (a fresh database is made on it)")
    p.add_argument(
        "--dead",
        default=",".join(map(str, DEAD)),
        help="taken jobs ahead of the first pending one, one measurement each (0,20000,60000,180000)",
    )
    p.add_argument("--max-jobs", type=int, default=10, help="jobs each claim asks for (10)")
    p.add_argument("--repeat", type=int, default=7, help="claims per count; medians shown (7)")
    p.add_argument("--json", help="also write the figures to this JSON file")
    return p


async def explained(conn: asyncpg.Connection, sql: str, *args: Any) -> tuple[float, int, int]:
    """Execution ms, shared buffers touched and rows answered of one run, rolled back."""
    transaction = conn.transaction()
    await transaction.start()
    try:
        answer = await conn.fetchval(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {sql}", *args)
    finally:
        await transaction.rollback()
    plan = json.loads(answer)[0]
    top = plan["Plan"]
    buffers = int(top.get("Shared Hit Blocks", 0)) + int(top.get("Shared Read Blocks", 0))
    return float(plan["Execution Time"]), buffers, int(top.get("Actual Rows", 0))


async def measure(url: str, counts: list[int], max_jobs: int, repeat: int) -> list[dict[str, Any]]:
    claim_sql, names = statement("job_claim").positional
    bind = {
        "queues": [QUEUE],
        "max_jobs": max_jobs,
        "worker_ids": [f"walk-{n}" for n in range(max_jobs)],
        "key_ids": [None] * max_jobs,
        "instance": "bench",
        "lease_seconds": [30] * max_jobs,
    }
    claim_args = [bind[name] for name in names]
    conn = await asyncpg.connect(raw_dsn(url))
    holder = await asyncpg.connect(raw_dsn(url))
    figures: list[dict[str, Any]] = []
    try:
        await conn.execute(INSERT, QUEUE, max(counts) + SPARE)
        await conn.execute("VACUUM ANALYZE jobs")
        hold = holder.transaction()
        await hold.start()
        await holder.fetchval("SELECT txid_current()")
        taken = 0
        for count in sorted(counts):
            while taken < count:
                step = min(BATCH, count - taken)
                await conn.execute(TAKE, QUEUE, step)
                taken += step
            head = await conn.fetchrow(HEAD, QUEUE)
            claims = [await explained(conn, claim_sql, *claim_args) for _ in range(repeat)]
            cursors = [
                await explained(conn, CURSOR_WALK, QUEUE, *head.values(), max_jobs)
                for _ in range(repeat)
            ]
            if any(rows != max_jobs for _, _, rows in claims + cursors):
                raise RuntimeError(f"a claim took fewer than {max_jobs} jobs at {count} taken")
            one = {
                "taken_ahead": count,
                "claim_ms": statistics.median(ms for ms, _, _ in claims),
                "claim_buffers": statistics.median(b for _, b, _ in claims),
                "cursor_ms": statistics.median(ms for ms, _, _ in cursors),
                "cursor_buffers": statistics.median(b for _, b, _ in cursors),
            }
            figures.append(one)
            print(
                f"{count:>9,}  {one['claim_ms']:9.2f}  {one['claim_buffers']:9.0f}"
                f"  {one['cursor_ms']:9.3f}  {one['cursor_buffers']:9.0f}",
                flush=True,
            )
        await hold.rollback()
    finally:
        await holder.close()
        await conn.close()
    return figures


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        counts = sorted({int(part) for part in args.dead.split(",") if part.strip()})
    except ValueError:
        raise SystemExit(f"--dead: not a list of integers: {args.dead!r}") from None
    if not counts or counts[0] < 0 or args.max_jobs < 1 or args.repeat < 1:
        raise SystemExit("--dead must be counts of 0 or more; --max-jobs and --repeat positive")
    started = time.monotonic()
    print(f"job_claim of {args.max_jobs} jobs, medians of {args.repeat}; a horizon held throughout")
    print(f"{'taken':>9}  {'claim ms':>9}  {'buffers':>9}  {'cursor ms':>9}  {'buffers':>9}")
    with database(args.dsn) as url:
        figures = asyncio.run(measure(url, counts, args.max_jobs, args.repeat))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump({"max_jobs": args.max_jobs, "figures": figures}, out, indent=2)
    print(f"finished in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
