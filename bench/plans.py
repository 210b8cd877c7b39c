"""What the history costs: rows each maintenance, dashboard and claim statement touches on a big table.

    python -m bench.plans                     # embedded PostgreSQL
    DATABASE_URL=postgresql://postgres@127.0.0.1:5432/test python -m bench.plans

Seeds a fresh database with a long history (200,000 finished jobs by default), 50,000 jobs
scheduled for tomorrow at a higher priority on a claimed queue, and a small backlog; then runs
each statement through the repository under ``EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON)`` and
prints the rows its scans touched, the rows it locked, the buffers and the time. A statement
whose cost is bounded by its batch or its answer touches a few hundred rows here, not hundreds
of thousands. ``tests/integration/test_history_costs.py`` asserts those bounds with the same
seed and the same counting.

The repository methods are driven through a connection wrapper that turns each statement into
an EXPLAIN, so the figures are those of the code in this checkout.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Select, TextClause, text
from sqlalchemy.dialects import postgresql
from sqlalchemy.ext.asyncio import AsyncConnection, create_async_engine

FINISHED_DEFAULT = 200_000
SCHEDULED_DEFAULT = 50_000
HISTORY_QUEUES = ("busy0", "busy1", "busy2", "busy3")
SMALL_QUEUE = "small"  # 51 old jobs, listed by queue= under a long history of other queues
RARE_TYPE = "rare"  # 51 jobs of a type that is otherwise absent
CLAIM_QUEUES = ("c0", "c1", "c2")
DUE_PER_CLAIM_QUEUE = 300


def nodes(plan: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    """Every node of a JSON plan, depth first (init plans and sub plans included)."""
    yield plan
    for child in plan.get("Plans", []):
        yield from nodes(child)


def rows_touched(plan: Mapping[str, Any]) -> int:
    """Rows the plan's scans read: returned plus removed by filters, over every loop."""
    total = 0.0
    for node in nodes(plan):
        if "Scan" not in node["Node Type"] or node["Node Type"] in ("CTE Scan", "Function Scan"):
            continue
        if node["Node Type"] in ("Subquery Scan", "Values Scan", "WorkTable Scan"):
            continue
        loops = node.get("Actual Loops", 1)
        per_loop = (
            node.get("Actual Rows", 0)
            + node.get("Rows Removed by Filter", 0)
            + node.get("Rows Removed by Index Recheck", 0)
        )
        total += per_loop * loops
    return round(total)


def rows_locked(plan: Mapping[str, Any]) -> int:
    """Rows the plan's LockRows nodes locked (FOR UPDATE ... SKIP LOCKED), over every loop."""
    return round(
        sum(
            n.get("Actual Rows", 0) * n.get("Actual Loops", 1)
            for n in nodes(plan)
            if n["Node Type"] == "LockRows"
        )
    )


def buffers(plan: Mapping[str, Any]) -> int:
    """Shared buffers hit or read by the whole statement."""
    return int(plan.get("Shared Hit Blocks", 0) + plan.get("Shared Read Blocks", 0))


@dataclass
class Explained:
    """One statement's analysed plan."""

    plan: Mapping[str, Any]
    execution_ms: float

    @property
    def touched(self) -> int:
        """Rows its scans read."""
        return rows_touched(self.plan)

    @property
    def locked(self) -> int:
        """Rows it locked."""
        return rows_locked(self.plan)

    def indexes(self) -> set[str]:
        """The indexes its scans used."""
        return {str(n["Index Name"]) for n in nodes(self.plan) if "Index Name" in n}


# A named statement of app/store/sql (what a store hands its Conn), not SQL text.
_STATEMENT_NAME = re.compile(r"[a-z][a-z0-9_]*")


class _EmptyResult:
    """Stands in for a statement's result: the caller gets no rows, the plan is kept aside."""

    def mappings(self) -> _EmptyResult:
        return self

    def all(self) -> list[Any]:
        return []

    def one_or_none(self) -> None:
        return None

    def __iter__(self) -> Iterator[Any]:
        return iter(())


@dataclass
class ExplainingConnection:
    """Wraps a connection so that every statement a repository method runs is EXPLAINed instead."""

    conn: AsyncConnection
    plans: list[Explained] = field(default_factory=list)

    async def execute(self, statement: Any, parameters: Mapping[str, Any] | None = None) -> Any:
        if isinstance(statement, TextClause):
            sql = statement.text
        elif isinstance(statement, Select):
            sql = str(
                statement.compile(
                    dialect=postgresql.dialect(),  # type: ignore[no-untyped-call]
                    compile_kwargs={"literal_binds": True},
                )
            )
        else:
            raise TypeError(f"cannot explain {type(statement).__name__}")
        if isinstance(statement, Select):
            # Literal values may hold colons (JSON): sent as they are, not parsed for binds.
            result = await self.conn.exec_driver_sql(
                "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql
            )
        else:
            result = await self.conn.execute(
                text("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql), dict(parameters or {})
            )
        self._keep(result.scalar_one())
        return _EmptyResult()

    async def fetch(self, sql: str, *args: Any) -> list[Any]:
        """The driver's call (the hot path's statements), EXPLAINed on the same connection.

        Also the stores' ``Conn.fetch(name, params)`` (app/store/conn.py): a bare statement name
        is looked up and run as the driver runs it, prepared with positional parameters.
        """
        if _STATEMENT_NAME.fullmatch(sql) and len(args) <= 1:
            from app.store.statements import statement

            named = statement(sql)
            sql = named.positional[0]
            args = tuple(named.arguments(dict(args[0] if args else {})))
        raw = await self.conn.get_raw_connection()
        driver: Any = raw.driver_connection
        self._keep(await driver.fetchval("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql, *args))
        return []

    async def fetch_query(self, query: Any) -> list[Any]:
        """The stores' ``Conn.fetch_query`` (a statement built with Core), EXPLAINed."""
        await self.execute(query)
        return []

    def _keep(self, raw: Any) -> None:
        document = (json.loads(raw) if isinstance(raw, str) else raw)[0]
        self.plans.append(Explained(document["Plan"], float(document["Execution Time"])))


async def explain(
    conn: AsyncConnection, call: Callable[[Any], Awaitable[Any]], *, rollback: bool = True
) -> list[Explained]:
    """Runs ``call(connection)`` with every statement EXPLAINed (and rolled back); answers the plans."""
    wrapper = ExplainingConnection(conn)
    transaction = await conn.begin()
    try:
        await call(wrapper)
    finally:
        if rollback:
            await transaction.rollback()
        else:
            await transaction.commit()
    return wrapper.plans


async def _scheduled_status(conn: AsyncConnection) -> str:
    """'scheduled' where the schema stores it, else 'pending' (before jobs had the state)."""
    definition = await conn.scalar(
        text("SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conname = 'ck_jobs_status'")
    )
    return "scheduled" if "scheduled" in str(definition) else "pending"


async def seed_history(
    conn: AsyncConnection, *, finished: int = FINISHED_DEFAULT, scheduled: int = SCHEDULED_DEFAULT
) -> None:
    """A long history: old small queue and rare type, many finished jobs, tomorrow's jobs, a backlog."""
    # The small queue and the rare type are the oldest rows: a newest-first walk of the primary
    # key would pass the whole history before reaching them.
    await conn.execute(
        text(
            "INSERT INTO jobs (queue, type, status, max_attempts, lease_seconds, finished_at) "
            "SELECT :queue, 'other', 'succeeded', 10, 30, now() - interval '1 hour' "
            "FROM generate_series(1, 51)"
        ),
        {"queue": SMALL_QUEUE},
    )
    await conn.execute(
        text(
            "INSERT INTO jobs (queue, type, status, max_attempts, lease_seconds, finished_at) "
            "SELECT 'busy0', :type, 'dead', 10, 30, now() - interval '1 hour' "
            "FROM generate_series(1, 51)"
        ),
        {"type": RARE_TYPE},
    )
    # Finished jobs, all inside their retention (nothing for the pruner to do): mostly succeeded.
    await conn.execute(
        text(
            "INSERT INTO jobs (queue, type, status, max_attempts, lease_seconds, attempts, "
            "                  started_at, finished_at, created_at) "
            "SELECT (CAST(:queues AS text[]))[1 + g % 4], 'work' || (g % 4), "
            "       CASE WHEN g % 50 = 0 THEN 'dead' WHEN g % 25 = 0 THEN 'cancelled' "
            "            ELSE 'succeeded' END, "
            "       10, 30, 1, now() - interval '2 hours', "
            "       now() - make_interval(secs => g % 3600), now() - interval '3 hours' "
            "FROM generate_series(1, :n) g"
        ),
        {"queues": list(HISTORY_QUEUES), "n": finished},
    )
    status = await _scheduled_status(conn)
    # Tomorrow's jobs on a claimed queue, at a higher priority than anything due.
    await conn.execute(
        text(
            "INSERT INTO jobs (queue, type, status, priority, max_attempts, lease_seconds, run_at) "
            "SELECT :queue, 'later', :status, 10, 10, 30, now() + interval '1 day' "
            "       + make_interval(secs => g) "
            "FROM generate_series(1, :n) g"
        ),
        {"queue": CLAIM_QUEUES[0], "status": status, "n": scheduled},
    )
    for queue in CLAIM_QUEUES:
        await conn.execute(
            text(
                "INSERT INTO jobs (queue, type, max_attempts, lease_seconds, run_at) "
                "SELECT :queue, 'now', 10, 30, now() - make_interval(secs => g) "
                "FROM generate_series(1, :n) g"
            ),
            {"queue": queue, "n": DUE_PER_CLAIM_QUEUE},
        )
    await conn.execute(text("ANALYZE jobs"))
    await conn.execute(text("ANALYZE queues"))


# The statements measured: name -> how to drive it through the repository.
Probe = Callable[[Any, Any], Awaitable[Any]]


def _list_filter(**fields: Any) -> Any:
    # Where ListFilter lives moved with the refactor of revision 0006; take it from either place.
    # Since revision 0010 its filters are a JobSearch.
    try:
        from app.domain.types import ListFilter
    except ImportError:  # the code before revision 0006
        from app.queue.repository import ListFilter  # type: ignore[attr-defined,no-redef]
    try:
        from app.domain.types import JobSearch
    except ImportError:
        return ListFilter(limit=51, **fields)
    return ListFilter(limit=51, search=JobSearch(**fields))


def _dead() -> Any:
    from app.domain import states

    return getattr(states, "VisibleStatus", states.JobStatus).DEAD


class _AnyStore:
    """The stores (app/store/) as one object with every statement's method, as the repository was."""

    def __init__(self, stores: Any) -> None:
        self._stores = [getattr(stores, f) for f in stores.__dataclass_fields__]

    def __getattr__(self, name: str) -> Any:
        for store in self._stores:
            if hasattr(store, name):
                return getattr(store, name)
        raise AttributeError(name)


def repository() -> Any:
    from app.settings import Settings

    settings = Settings(database_url="postgresql://unused/unused")
    try:
        from app.store import stores_for
    except ImportError:  # the code before issue 19: one repository
        try:
            from app.main import repository_for  # type: ignore[attr-defined]
        except ImportError:  # the code before revision 0006
            from app.queue import repository as old  # type: ignore[attr-defined]

            return old.Repository(backoff=old.BackoffPolicy())
        return repository_for(settings)
    return _AnyStore(stores_for(settings))


async def _claim(repo: Any, conn: Any, queues: list[str], max_jobs: int) -> Any:
    # The claim's signature changed when claims began to share statements (slots), and again
    # when slots became ClaimSlot values (with the API key of the worker).
    try:
        from app.domain.types import ClaimSlot

        slots: list[Any] = [ClaimSlot("bench", None, 30)] * max_jobs
    except ImportError:
        slots = [("bench", 30)] * max_jobs
    try:
        return await repo.job_claim(conn, queues=queues, slots=slots)
    except TypeError:  # the code before: one worker per claim statement
        return await repo.job_claim(
            conn, worker_id="bench", queues=queues, max_jobs=max_jobs, lease_seconds=30
        )


def probes(repo: Any) -> dict[str, Probe]:
    """The measured statements, each a call of one repository method on a wrapped connection."""

    async def prune(conn: Any, _: Any) -> Any:
        return await repo.job_prune(
            conn,
            batch_size=1000,
            succeeded_seconds=7 * 86400.0,
            cancelled_seconds=7 * 86400.0,
            dead_seconds=30 * 86400.0,
        )

    async def stats(conn: Any, _: Any) -> Any:
        return await repo.queue_stats(conn)

    async def list_type(conn: Any, _: Any) -> Any:
        # A type filter names its queue: the rare type's jobs live in busy0.
        where = _list_filter(queue="busy0", type=RARE_TYPE)
        return await repo.job_list(conn, where=where)

    async def list_queue(conn: Any, _: Any) -> Any:
        return await repo.job_list(conn, where=_list_filter(queue=SMALL_QUEUE))

    async def list_status(conn: Any, _: Any) -> Any:
        where = _list_filter(status=_dead())
        return await repo.job_list(conn, where=where)

    async def claim_empty(conn: Any, _: Any) -> Any:
        # Only tomorrow's jobs on c0's side of the index once c0's due jobs are gone: claim
        # from a queue that has nothing due but the scheduled rows.
        return await _claim(repo, conn, ["c0-later"], 10)

    async def claim_three(conn: Any, _: Any) -> Any:
        return await _claim(repo, conn, list(CLAIM_QUEUES), 100)

    async def backstop(conn: Any, _: Any) -> Any:
        return await repo.job_due_in_queues(conn, queues=["c0-later"], cap=100)

    return {
        "pruner, nothing to prune": prune,
        "GET /v1/queues": stats,
        "list queue=busy0&type=rare (51 rows)": list_type,
        "list queue=small (51 oldest rows)": list_queue,
        "list status=dead, no queue": list_status,
        "claim, only tomorrow's jobs in the queue": claim_empty,
        "claim 3 queues, max_jobs=100": claim_three,
        "long-poll backstop, only tomorrow's jobs": backstop,
    }


async def move_scheduled_to(conn: AsyncConnection, queue: str) -> None:
    """Puts tomorrow's jobs on a queue of their own (the empty-claim case), then re-analyses."""
    await conn.execute(
        text("UPDATE jobs SET queue = :queue WHERE type = 'later'"), {"queue": queue}
    )
    await conn.execute(text("ANALYZE jobs"))


async def measure(url: str, *, finished: int, scheduled: int) -> list[tuple[str, Explained]]:
    """Seeds the database at ``url`` and explains every probe; answers (name, plan) pairs."""
    from app.db import async_url

    repo = repository()
    engine = create_async_engine(async_url(url))
    try:
        async with engine.begin() as conn:
            await seed_history(conn, finished=finished, scheduled=scheduled)
            await move_scheduled_to(conn, "c0-later")
        out: list[tuple[str, Explained]] = []
        async with engine.connect() as conn:
            for name, probe in probes(repo).items():
                plans = await explain(conn, lambda c, p=probe: p(c, None))
                out.extend(
                    (name if len(plans) == 1 else f"{name} #{i}", plan)
                    for i, plan in enumerate(plans)
                )
        return out
    finally:
        await engine.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--finished", type=int, default=FINISHED_DEFAULT)
    parser.add_argument("--scheduled", type=int, default=SCHEDULED_DEFAULT)
    args = parser.parse_args()
    from bench.harness import database

    with database() as url:
        started = time.monotonic()
        results = asyncio.run(measure(url, finished=args.finished, scheduled=args.scheduled))
        print(
            f"{args.finished:,} finished jobs, {args.scheduled:,} scheduled for tomorrow "
            f"(seeded and explained in {time.monotonic() - started:.0f} s)"
        )
        print(f"{'statement':48} {'rows touched':>12} {'locked':>7} {'buffers':>8} {'ms':>8}")
        for name, plan in results:
            print(
                f"{name:48} {plan.touched:12,} {plan.locked:7,} {buffers(plan.plan):8,} "
                f"{plan.execution_ms:8.2f}"
            )


if __name__ == "__main__":
    main()
