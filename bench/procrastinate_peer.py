"""Procrastinate 3.10 in process: the second peer ``python -m bench --peers`` runs the rows with.

Two halves, both about Procrastinate only, in the shape of PGQueuer's (``bench/peers.py``):

- the load process (``python -m bench.load procrastinate-enqueue`` / ``procrastinate-drain``)
  runs the row's workload through Procrastinate's own API on one ``App`` whose
  ``PsycopgConnector`` pool holds one connection per simulated client (its defaults otherwise:
  each statement in a transaction of its own, the pool checking a connection before handing it
  out): :func:`enqueue` calls the task's ``defer_async`` once per job, or ``batch_defer_async``
  with 500 jobs; :func:`drain` runs one worker per simulated worker, each with concurrency 1 and
  ``wait=False`` (it stops once a fetch finds nothing), and a task that records each job it is
  given. Procrastinate fetches one job per statement: it has no claim of several jobs at once,
  so the rows with ``max_jobs`` 50 are not run, nor those with concurrency keys;
- the orchestrator (``bench/suite.py``) gets a :class:`ProcrastinatePeer` from :func:`peer`: a
  fresh database on the same server with Procrastinate's schema applied by its own schema
  manager, emptied before each run and checked against what the load reports.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
from collections.abc import AsyncIterator
from typing import Any

from procrastinate import App, JobContext, PsycopgConnector
from procrastinate.exceptions import ConnectorException
from procrastinate.types import JSONDict

from bench import checks, databases
from bench.common import JOB_TYPE, Counter, Errors, Meter

VERSION = importlib.metadata.version("procrastinate")
APPLICATION_NAME = "bench-procrastinate"
TASK = JOB_TYPE
QUEUE = "bench"
TABLES = (
    "procrastinate_jobs",
    "procrastinate_events",
    "procrastinate_periodic_defers",
    "procrastinate_workers",
)

__all__ = ["VERSION", "ProcrastinatePeer", "drain", "enqueue", "peer"]


# -- the load process ----------------------------------------------------------------------------


class CountingConnector(PsycopgConnector):
    """Procrastinate's psycopg connector, counting the statements it sends."""

    statements = 0

    async def execute_query_async(self, query: Any, **arguments: Any) -> None:
        """One statement without rows, counted."""
        self.statements += 1
        await super().execute_query_async(query, **arguments)

    async def execute_query_one_async(self, query: Any, **arguments: Any) -> dict[str, Any]:
        """One statement answering one row, counted."""
        self.statements += 1
        row: dict[str, Any] = await super().execute_query_one_async(query, **arguments)
        return row

    async def execute_query_all_async(self, query: Any, **arguments: Any) -> list[dict[str, Any]]:
        """One statement answering rows, counted."""
        self.statements += 1
        rows: list[dict[str, Any]] = await super().execute_query_all_async(query, **arguments)
        return rows


def application(dsn: str, connections: int) -> tuple[App, CountingConnector]:
    """An ``App`` on ``dsn`` with a pool of ``connections`` connections, and its connector."""
    connector = CountingConnector(
        conninfo=dsn,
        min_size=connections,
        max_size=connections,
        kwargs={"application_name": APPLICATION_NAME},
    )
    return App(connector=connector), connector


async def enqueue(args: dict[str, Any], meter: Meter, errors: Errors) -> dict[str, Any]:
    """Defers ``jobs`` jobs from ``clients`` clients: ``defer_async`` per job (``batch`` 1), else
    ``batch_defer_async`` with ``batch`` jobs a call (one statement either way)."""
    batch, clients = int(args["batch"]), int(args["clients"])
    numbers = Counter(int(args["jobs"]))
    app, connector = application(args["dsn"], clients)

    async def nothing(n: int) -> None:
        """The task the jobs name; the enqueue runs never execute it."""

    task = app.task(name=TASK, queue=QUEUE)(nothing)
    created: list[int] = []
    calls = 0

    async def client() -> None:
        nonlocal calls
        while chunk := numbers.take(batch):
            calls += 1
            try:
                if batch == 1:
                    created.append(await task.defer_async(n=chunk[0]))
                else:
                    kwargs: list[JSONDict] = [{"n": n} for n in chunk]
                    created.extend(await task.batch_defer_async(*kwargs))
            except ConnectorException as exc:
                errors.add(f"defer: {exc!r}")

    async with app.open_async():  # opens every connection of the pool before the timed section
        statements = connector.statements
        meter.start()
        await asyncio.gather(*(client() for _ in range(clients)))
        meter.stop()
        statements = connector.statements - statements
    return {
        "jobs": numbers.next,
        "calls": calls,
        "statements": statements,
        "created": len(created),
        "created_unique": len(set(created)),
    }


async def drain(args: dict[str, Any], meter: Meter, errors: Errors) -> dict[str, Any]:
    """``workers`` Procrastinate workers (concurrency 1, ``wait=False``) until each finds nothing.

    Each worker fetches a job (one statement), runs the task, records the job's id and marks it
    succeeded (one statement), and stops at its first empty fetch. They share the app's pool, one
    connection each. A worker registers itself and prunes stalled workers as it starts, and
    unregisters as it stops: three statements per worker, inside the timed section (``run()``
    does all of it). No LISTEN (nothing waits), no signal handlers (several workers share the
    process).
    """
    workers = int(args["workers"])
    if int(args["max_jobs"]) != 1:
        errors.add("Procrastinate fetches one job per statement: max_jobs must be 1")
        return {"jobs": 0, "statements": 0, "completed_ids": []}
    app, connector = application(args["dsn"], workers)
    completed: list[int] = []

    async def handle(context: JobContext, n: int) -> None:
        """Records the job it was given."""
        assert context.job.id is not None
        completed.append(context.job.id)

    app.task(name=TASK, queue=QUEUE, pass_context=True)(handle)
    async with app.open_async():
        statements = connector.statements
        meter.start()
        outcomes = await asyncio.gather(
            *(
                app.run_worker_async(
                    queues=[QUEUE],
                    name=f"{APPLICATION_NAME}-{i}",
                    concurrency=1,
                    wait=False,
                    listen_notify=False,
                    install_signal_handlers=False,
                )
                for i in range(workers)
            ),
            return_exceptions=True,
        )
        meter.stop()
        statements = connector.statements - statements
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            errors.add(f"run_worker_async: {outcome!r}")
    return {"jobs": len(completed), "statements": statements, "completed_ids": completed}


# -- the orchestrator ----------------------------------------------------------------------------

ENQUEUED = """
SELECT count(*) AS total,
       count(*) FILTER (WHERE status = 'todo') AS todo,
       (SELECT count(*) FROM procrastinate_events WHERE type = 'deferred') AS deferred
FROM procrastinate_jobs
"""

DRAINED = """
SELECT count(*) AS total,
       count(*) FILTER (WHERE status <> 'succeeded') AS unfinished,
       count(*) FILTER (WHERE attempts <> 1) AS reattempted,
       (SELECT count(*) FROM procrastinate_events WHERE type = 'started') AS started,
       (SELECT count(DISTINCT job_id) FROM procrastinate_events WHERE type = 'started')
           AS started_jobs
FROM procrastinate_jobs
"""


class ProcrastinatePeer:
    """Procrastinate's database as the orchestrator sees it: the load's target, emptying, checks."""

    name = "procrastinate"  # its figures' key in each row
    workload = "procrastinate"  # the load process's procrastinate-enqueue / procrastinate-drain

    def __init__(self, *, dsn: str, database: str, admin: Any) -> None:
        self.dsn = dsn
        self.database = database
        self.admin = admin  # one asyncpg connection to the peer database

    def runs(self, *, max_jobs: int, keys: int) -> bool:
        """Rows claiming one job at a time (a worker fetches one job per statement), without
        concurrency keys (its locks serialise jobs, they do not cap them)."""
        return max_jobs == 1 and keys == 0

    def describe(self) -> dict[str, str]:
        """What the settings block and the JSON say about the peer."""
        return {"version": VERSION, "database": self.database}

    async def truncate(self) -> None:
        """Empties Procrastinate's jobs, events, periodic defers and workers."""
        await self.admin.execute(f"TRUNCATE {', '.join(TABLES)}")

    async def queued_ids(self) -> set[int]:
        """The ids of the jobs in the jobs table."""
        return {row["id"] for row in await self.admin.fetch("SELECT id FROM procrastinate_jobs")}

    async def check_enqueue(self, result: dict[str, Any], n: int) -> list[str]:
        """Every job sent, answered with a distinct id, stored 'todo' with one 'deferred' event."""
        failures: list[str] = []
        state = await self.admin.fetchrow(ENQUEUED)
        failures.extend(checks.answered(result, n))
        if state["total"] != result["jobs"] or state["todo"] != state["total"]:
            failures.append(
                f"{state['total']} rows in procrastinate_jobs ({state['todo']} todo) after "
                f"{result['jobs']} deferred"
            )
        if state["deferred"] != result["jobs"]:
            failures.append(f"{state['deferred']} 'deferred' events after {result['jobs']} jobs")
        return failures

    async def check_drain(self, result: dict[str, Any], preloaded: set[int]) -> list[str]:
        """Each pre-loaded job handled once, started once (one fetch), succeeded on attempt one."""
        failures = checks.handled(result["completed_ids"], preloaded, "handled")
        n = len(preloaded)
        state = await self.admin.fetchrow(DRAINED)
        if state["total"] != n:
            failures.append(f"{state['total']} rows in procrastinate_jobs, {n} pre-loaded")
        if state["unfinished"]:
            failures.append(f"{state['unfinished']} jobs not succeeded after the drain")
        if state["reattempted"]:
            failures.append(f"{state['reattempted']} jobs not finished on their first attempt")
        if state["started"] != n or state["started_jobs"] != n:
            failures.append(
                f"{state['started']} 'started' events ({state['started_jobs']} jobs) for {n} jobs"
                " (fetched more than once?)"
            )
        return failures


@contextlib.asynccontextmanager
async def peer(dsn: str) -> AsyncIterator[ProcrastinatePeer]:
    """A fresh database next to ``dsn``'s on the same server, Procrastinate's schema applied by
    its own schema manager; dropped after."""
    async with databases.sibling(dsn, "procrastinate") as (name, peer_dsn):
        app = App(connector=PsycopgConnector(conninfo=peer_dsn, min_size=1, max_size=1))
        async with app.open_async():
            await app.schema_manager.apply_schema_async()
        admin = await databases.connect(peer_dsn)
        try:
            yield ProcrastinatePeer(dsn=peer_dsn, database=name, admin=admin)
        finally:
            await admin.close()
