"""PGQueuer 1.6 in process: the peer ``python -m bench --peers`` runs every table row with.

Two halves, both about PGQueuer only:

- the load process (``python -m bench.load pgqueuer-enqueue`` / ``pgqueuer-drain``) runs the
  row's workload through PGQueuer's own API, one asyncpg connection (``AsyncpgDriver``) per
  simulated client: :func:`enqueue` calls ``Queries.enqueue`` with one job, or with lists of 500;
  :func:`drain` runs one ``QueueManager`` per worker in drain mode with ``batch_size`` = the
  row's ``max_jobs`` and a handler that records each job it is given;
- the orchestrator (``bench/suite.py``) gets a :class:`Peer` from :func:`peer`: a fresh database
  on the same server (``bench/databases.py``) with PGQueuer's schema installed by its own
  installer (``Queries.install()``), emptied before each run and checked against what the load
  reports.

PGQueuer's tables live in their own database so jobq's figures (commits on the jobq database,
its triggers and counters) are untouched by the peer's runs. Procrastinate, the other peer, is
``bench/procrastinate_peer.py``. Object names come from PGQueuer's
settings (``PGQUEUER_*`` environment variables, defaults otherwise), the same in both processes.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import json
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import asyncpg
from pgqueuer import AsyncpgDriver, Job, Queries, QueueManager
from pgqueuer.domain.settings import db_settings
from pgqueuer.types import QueueExecutionMode

from bench import baseline, checks, databases
from bench.baseline import close_all
from bench.common import JOB_TYPE, Counter, Errors, Meter

VERSION = importlib.metadata.version("pgqueuer")
APPLICATION_NAME = "bench-pgqueuer"
ENTRYPOINT = JOB_TYPE
# How long an idle QueueManager waits before it looks again when no NOTIFY wakes it. In drain
# mode it waits at the end while its last acknowledgements are still buffered; their DELETE's
# NOTIFY wakes it (tried: the 30 s default never stalled a drain), and 0.1 s bounds the wait
# should none come. It does not shorten anything else: mid-drain PGQueuer re-polls after 0.1 s.
DEQUEUE_TIMEOUT = timedelta(seconds=0.1)

__all__ = ["VERSION", "Peer", "drain", "enqueue", "peer"]


# -- the load process ----------------------------------------------------------------------------


class CountingDriver(AsyncpgDriver):
    """PGQueuer's asyncpg driver, counting the statements it sends (one round trip each)."""

    def __init__(self, connection: Any) -> None:
        super().__init__(connection)
        self.statements = 0

    async def fetch(self, query: str, *args: object) -> list[dict[str, object]]:
        """One ``fetch`` through PGQueuer's driver, counted."""
        self.statements += 1
        return await super().fetch(query, *args)

    async def execute(self, query: str, *args: object) -> str:
        """One ``execute`` through PGQueuer's driver, counted."""
        self.statements += 1
        return await super().execute(query, *args)


class DrainManager(QueueManager):
    """A ``QueueManager`` whose start-up schema check runs once, before the timed section.

    ``run()`` opens with ``verify_structure()`` (some 15 catalog queries); calling it ahead of
    the timer keeps that start-up cost out of the drain's jobs/s, as jobq's workers open their
    connections before theirs.
    """

    verified = False

    async def verify_structure(self) -> None:
        """PGQueuer's own check the first time; nothing after."""
        if not self.verified:
            await super().verify_structure()
            self.verified = True


async def connect_all(dsn: str, n: int) -> list[Any]:
    """``n`` asyncpg connections, named ``bench-pgqueuer`` in ``pg_stat_activity``."""
    return await baseline.connect_all(dsn, n, APPLICATION_NAME)


def payload(n: int) -> bytes:
    """The payload of job number ``n``: the JSON the other targets send, as PGQueuer's bytes."""
    return json.dumps({"n": n}).encode()


async def enqueue(args: dict[str, Any], meter: Meter, errors: Errors) -> dict[str, Any]:
    """Enqueues ``jobs`` jobs from ``clients`` connections through ``Queries.enqueue``.

    ``batch`` 1 is one ``enqueue(entrypoint, payload)`` call per job; otherwise each call passes
    lists of ``batch`` entrypoints, payloads and priorities (one statement either way).
    """
    batch = int(args["batch"])
    numbers = Counter(int(args["jobs"]))
    conns = await connect_all(args["dsn"], int(args["clients"]))
    drivers = [CountingDriver(conn) for conn in conns]
    created: list[int] = []
    calls = 0

    async def client(queries: Queries) -> None:
        nonlocal calls
        while chunk := numbers.take(batch):
            calls += 1
            try:
                if batch == 1:
                    ids = await queries.enqueue(ENTRYPOINT, payload(chunk[0]))
                else:
                    ids = await queries.enqueue(
                        [ENTRYPOINT] * len(chunk), [payload(n) for n in chunk], [0] * len(chunk)
                    )
            except asyncpg.PostgresError as exc:
                errors.add(f"enqueue: {exc!r}")
                continue
            created.extend(ids)

    await asyncio.gather(*(conn.fetchval("SELECT 1") for conn in conns))
    statements = sum(driver.statements for driver in drivers)
    meter.start()
    await asyncio.gather(*(client(Queries(driver)) for driver in drivers))
    meter.stop()
    await close_all(conns)
    return {
        "jobs": numbers.next,
        "calls": calls,
        "statements": sum(driver.statements for driver in drivers) - statements,
        "created": len(created),
        "created_unique": len(set(created)),
    }


async def drain(args: dict[str, Any], meter: Meter, errors: Errors) -> dict[str, Any]:
    """``workers`` QueueManagers in drain mode, ``batch_size`` = ``max_jobs``, until all are done.

    This is PGQueuer's documented worker, with its defaults except the idle wait
    (:data:`DEQUEUE_TIMEOUT`): it dequeues again as soon as a batch is handed to its tasks, without
    waiting for them (no ``max_concurrent_tasks``), and acknowledges in a buffer: finished jobs
    are moved to the log (DELETE + INSERT, one statement) when ``batch_size`` of them have
    finished or 0.1 s has passed, and on shutdown. The timed section ends when every manager's
    ``run()`` has returned, so every acknowledgement is flushed inside it.
    """
    batch = int(args["max_jobs"])
    conns = await connect_all(args["dsn"], int(args["workers"]))
    drivers = [CountingDriver(conn) for conn in conns]
    completed: list[int] = []

    async def handle(job: Job) -> None:
        completed.append(job.id)

    managers: list[DrainManager] = []
    for driver in drivers:
        manager = DrainManager(Queries(driver))
        manager.entrypoint(ENTRYPOINT, accepts_context=False)(handle)
        managers.append(manager)
    await asyncio.gather(*(manager.verify_structure() for manager in managers))
    statements = sum(driver.statements for driver in drivers)
    meter.start()
    outcomes = await asyncio.gather(
        *(
            manager.run(
                dequeue_timeout=DEQUEUE_TIMEOUT, batch_size=batch, mode=QueueExecutionMode.drain
            )
            for manager in managers
        ),
        return_exceptions=True,
    )
    meter.stop()
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            errors.add(f"QueueManager.run: {outcome!r}")
    await close_all(conns)
    return {
        "jobs": len(completed),
        "statements": sum(driver.statements for driver in drivers) - statements,
        "completed_ids": completed,
    }


# -- the orchestrator ----------------------------------------------------------------------------


class Peer:
    """PGQueuer's database as the orchestrator sees it: where the load goes, emptying, checks."""

    name = "pgqueuer"  # its figures' key in each row
    workload = "pgqueuer"  # the load process's pgqueuer-enqueue / pgqueuer-drain

    def __init__(self, *, dsn: str, database: str, admin: Any) -> None:
        self.dsn = dsn
        self.database = database
        self.admin = admin  # one asyncpg connection to the peer database
        names = db_settings().qualified
        self.queue_table = names.queue_table
        self.log_table = names.queue_table_log
        self.statistics_table = names.statistics_table

    def runs(self, *, max_jobs: int, keys: int) -> bool:
        """Every row (its claim takes ``batch_size`` jobs; concurrency keys are jobq's alone)."""
        return True

    def describe(self) -> dict[str, str]:
        """What the settings block and the JSON say about the peer."""
        return {
            "version": VERSION,
            "database": self.database,
            "durability": db_settings().durability.value,
        }

    async def truncate(self) -> None:
        """Empties PGQueuer's queue, log and statistics tables."""
        await self.admin.execute(
            f"TRUNCATE {self.queue_table}, {self.log_table}, {self.statistics_table}"
        )

    async def queued_ids(self) -> set[int]:
        """The ids of the jobs in the queue table."""
        return {row["id"] for row in await self.admin.fetch(f"SELECT id FROM {self.queue_table}")}

    async def check_enqueue(self, result: dict[str, Any], n: int) -> list[str]:
        """Every job sent, answered with a distinct id, stored queued and logged once as queued."""
        failures: list[str] = []
        state = await self.admin.fetchrow(
            f"SELECT count(*) AS total, count(*) FILTER (WHERE status = 'queued') AS queued, "
            f"(SELECT count(*) FROM {self.log_table} WHERE status = 'queued') AS logged "
            f"FROM {self.queue_table}"
        )
        failures.extend(checks.answered(result, n))
        if state["total"] != result["jobs"] or state["queued"] != state["total"]:
            failures.append(
                f"{state['total']} rows in {self.queue_table} ({state['queued']} queued) after "
                f"{result['jobs']} enqueued"
            )
        if state["logged"] != result["jobs"]:
            failures.append(f"{state['logged']} 'queued' log rows after {result['jobs']} enqueued")
        return failures

    async def check_drain(self, result: dict[str, Any], preloaded: set[int]) -> list[str]:
        """Each pre-loaded job handled once, picked once, logged successful once; queue empty."""
        failures = checks.handled(result["completed_ids"], preloaded, "handled")
        n = len(preloaded)
        left = await self.admin.fetchval(f"SELECT count(*) FROM {self.queue_table}")
        log = await self.admin.fetchrow(
            f"SELECT count(*) FILTER (WHERE status = 'picked') AS picked, "
            f"count(*) FILTER (WHERE status = 'successful') AS successful, "
            f"count(DISTINCT job_id) FILTER (WHERE status = 'successful') AS successful_unique, "
            f"count(*) FILTER (WHERE status NOT IN ('queued', 'picked', 'successful')) AS other "
            f"FROM {self.log_table}"
        )
        if left:
            failures.append(f"{left} rows left in {self.queue_table} after the drain")
        if log["successful"] != n or log["successful_unique"] != n:
            failures.append(
                f"{log['successful']} 'successful' log rows ({log['successful_unique']} jobs), "
                f"{n} pre-loaded"
            )
        if log["picked"] != n:
            failures.append(f"{log['picked']} 'picked' log rows for {n} jobs (re-picked?)")
        if log["other"]:
            failures.append(f"{log['other']} log rows neither queued, picked nor successful")
        return failures


@contextlib.asynccontextmanager
async def peer(dsn: str) -> AsyncIterator[Peer]:
    """A fresh database next to ``dsn``'s on the same server, PGQueuer installed; dropped after."""
    async with databases.sibling(dsn, "pgqueuer") as (name, peer_dsn):
        admin = await databases.connect(peer_dsn)
        try:
            await Queries(AsyncpgDriver(admin)).install()
            yield Peer(dsn=peer_dsn, database=name, admin=admin)
        finally:
            await admin.close()
