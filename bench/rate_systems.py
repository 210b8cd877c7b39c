"""The three systems as ``python -m bench.rate`` sees them: where the load goes, emptying, depth, checks.

:func:`open_systems` brings up the systems asked for on one PostgreSQL server, each on a
database of its own, and takes them down afterwards:

- ``jobq``: a real `jobq serve` process (``bench/harness.py``) on the benchmark's migrated
  database;
- ``lean``: a fresh database ``<name>_lean`` holding the lean queue table
  (``bench/rate_lean.py``'s :data:`~bench.rate_lean.LEAN_SCHEMA`);
- ``pgqueuer``: a fresh database ``<name>_pgqueuer`` with PGQueuer's schema, installed by its own
  installer (``bench/peers.py``).

Each :class:`System` empties its tables before a run, reports its queue depth (jobs waiting to
be picked) when sampled, and checks after the run that every job the load enqueued is in the
database and was done exactly once: claimed once, completed once, nothing left.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Any, Protocol
from urllib.parse import urlsplit, urlunsplit

import asyncpg

from bench.harness import JobqProcess, jobq_process, raw_dsn
from bench.rate_lean import LEAN_SCHEMA, LEAN_TABLE

QUEUE = "rate"
ORCHESTRATOR = "bench-orchestrator"
TRUNCATE_ATTEMPTS = 5


class System(Protocol):
    """One system as the orchestrator handles it."""

    name: str
    server_pids: list[int]  # processes whose CPU the load measures (jobq serve), else none

    def load_args(self) -> dict[str, Any]:
        """Where the load process finds the system."""

    async def truncate(self) -> None:
        """Empties the system's tables."""

    async def depth(self) -> int:
        """Jobs waiting to be picked up now."""

    async def verify(self, result: dict[str, Any]) -> list[str]:
        """What the database says against the load's figures: failed checks, none when right."""

    def diagnostics(self) -> str:
        """What to print after a failed run (a server's last output), kept for later."""


def load_checks(result: dict[str, Any]) -> list[str]:
    """The load process's own account: every job sent, answered once, done once, no errors."""
    failures: list[str] = []
    scheduled, sent = result["jobs_scheduled"], result["sent"]
    enqueued, completed = result["enqueued_ids"], result["completed_ids"]
    if result["error_count"]:
        shown = "; ".join(result["errors"][:3])
        failures.append(f"{result['error_count']} errors in the load process: {shown}")
    if sent != scheduled:
        failures.append(f"{sent} of {scheduled} scheduled jobs sent")
    if len(enqueued) != sent or len(set(enqueued)) != len(enqueued):
        failures.append(
            f"{sent} sent, {len(enqueued)} ids answered ({len(set(enqueued))} distinct)"
        )
    if len(set(completed)) != len(completed):
        failures.append(f"{len(completed) - len(set(completed))} jobs done more than once")
    if missing := set(enqueued) - set(completed):
        failures.append(f"{len(missing)} enqueued jobs never done, e.g. {min(missing)}")
    if extra := set(completed) - set(enqueued):
        failures.append(f"{len(extra)} done ids were never enqueued, e.g. {min(extra)}")
    if result["started_twice"]:
        failures.append(f"{result['started_twice']} jobs handed to a worker twice")
    return failures


async def table_checks(admin: Any, table: str, done: str, result: dict[str, Any]) -> list[str]:
    """The rows of ``table`` are exactly the jobs enqueued, each ``done`` after one claim."""
    failures: list[str] = []
    stored = {row["id"] for row in await admin.fetch(f"SELECT id FROM {table}")}
    state = await admin.fetchrow(
        f"SELECT count(*) FILTER (WHERE status <> $1) AS unfinished, "
        f"count(*) FILTER (WHERE attempts <> 1) AS reclaimed FROM {table}",
        done,
    )
    enqueued = set(result["enqueued_ids"])
    if stored != enqueued:
        failures.append(
            f"{len(stored)} rows in {table} for {len(enqueued)} jobs enqueued "
            f"({len(stored - enqueued)} not enqueued, {len(enqueued - stored)} missing)"
        )
    if state["unfinished"]:
        failures.append(f"{state['unfinished']} rows in {table} not {done!r} after the run")
    if state["reclaimed"]:
        failures.append(f"{state['reclaimed']} rows in {table} claimed more than once")
    return failures


class JobqSystem:
    """`jobq serve` over HTTP, on the benchmark's database."""

    name = "jobq"

    def __init__(self, admin: Any, served: JobqProcess) -> None:
        self.admin = admin
        self.served = served
        self.server_pids = [served.pid]

    def load_args(self) -> dict[str, Any]:
        """The instance's URL and the queue."""
        return {"base": self.served.base, "queue": QUEUE}

    def diagnostics(self) -> str:
        """The instance's last lines of output; its log file is kept."""
        self.served.keep_log = True
        return f"jobq serve output (kept in {self.served.log_path}):\n{self.served.log_tail()}"

    async def truncate(self) -> None:
        """Empties the queue tables (a trigger clears the counters).

        The instance's background loops take locks on these tables too, and TRUNCATE takes its
        exclusive locks one table at a time: PostgreSQL may end either side as a deadlock, and
        then the TRUNCATE is tried again.
        """
        for attempt in range(1, TRUNCATE_ATTEMPTS + 1):
            try:
                await self.admin.execute(
                    "TRUNCATE jobs, queues, flow_limits, flow_state, flow_released"
                )
            except asyncpg.DeadlockDetectedError:
                if attempt == TRUNCATE_ATTEMPTS:
                    raise
            else:
                return

    async def depth(self) -> int:
        """Pending jobs (the claim index's rows)."""
        value: int = await self.admin.fetchval("SELECT count(*) FROM jobs WHERE status = 'pending'")
        return value

    async def verify(self, result: dict[str, Any]) -> list[str]:
        """Every enqueued job a row, succeeded, claimed once."""
        return load_checks(result) + await table_checks(self.admin, "jobs", "succeeded", result)


class LeanSystem:
    """The lean raw-SQL queue on its own database."""

    name = "lean"

    def __init__(self, admin: Any, dsn: str) -> None:
        self.admin = admin
        self.dsn = dsn
        self.server_pids: list[int] = []

    def load_args(self) -> dict[str, Any]:
        """The lean database and the queue."""
        return {"dsn": self.dsn, "queue": QUEUE}

    async def truncate(self) -> None:
        """Empties the lean table."""
        await self.admin.execute(f"TRUNCATE {LEAN_TABLE} RESTART IDENTITY")

    async def depth(self) -> int:
        """Pending rows."""
        value: int = await self.admin.fetchval(
            f"SELECT count(*) FROM {LEAN_TABLE} WHERE status = 'pending'"
        )
        return value

    async def verify(self, result: dict[str, Any]) -> list[str]:
        """Every enqueued job a row, done, claimed once."""
        return load_checks(result) + await table_checks(self.admin, LEAN_TABLE, "done", result)

    def diagnostics(self) -> str:
        """Nothing beyond the failures (no server process)."""
        return ""


class PgqueuerSystem:
    """PGQueuer's database (``bench.peers.Peer``)."""

    name = "pgqueuer"

    def __init__(self, peer: Any) -> None:
        self.peer = peer
        self.server_pids: list[int] = []

    def load_args(self) -> dict[str, Any]:
        """PGQueuer's database."""
        return {"dsn": self.peer.dsn}

    async def truncate(self) -> None:
        """Empties PGQueuer's queue, log and statistics tables."""
        await self.peer.truncate()

    async def depth(self) -> int:
        """Queued jobs."""
        value: int = await self.peer.admin.fetchval(
            f"SELECT count(*) FROM {self.peer.queue_table} WHERE status = 'queued'"
        )
        return value

    async def verify(self, result: dict[str, Any]) -> list[str]:
        """Each enqueued job handled once, picked once, logged successful once; queue empty."""
        checked = {"completed_ids": result["completed_ids"]}
        return load_checks(result) + await self.peer.check_drain(
            checked, set(result["enqueued_ids"])
        )

    def diagnostics(self) -> str:
        """Nothing beyond the failures (PGQueuer runs in the load process)."""
        return ""


def sibling(dsn: str, name: str) -> str:
    """``dsn`` pointing at database ``name`` on the same server."""
    return urlunsplit(urlsplit(dsn)._replace(path=f"/{name}"))


@contextlib.asynccontextmanager
async def lean_database(dsn: str) -> AsyncIterator[LeanSystem]:
    """A fresh database next to ``dsn``'s with the lean queue table; dropped afterwards."""
    server = await asyncpg.connect(dsn, server_settings={"application_name": ORCHESTRATOR})
    name = f"{await server.fetchval('SELECT current_database()')}_lean"
    try:
        await server.execute(f'CREATE DATABASE "{name}"')
        lean_dsn = sibling(dsn, name)
        admin = await asyncpg.connect(lean_dsn, server_settings={"application_name": ORCHESTRATOR})
        try:
            await admin.execute(LEAN_SCHEMA)
            yield LeanSystem(admin, lean_dsn)
        finally:
            await admin.close()
    finally:
        await server.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await server.close()


@contextlib.asynccontextmanager
async def open_systems(url: str, names: Sequence[str]) -> AsyncIterator[dict[str, System]]:
    """The systems named, ready on ``url``'s server; stopped and their databases dropped after."""
    dsn = raw_dsn(url)
    chosen: dict[str, System] = {}
    async with contextlib.AsyncExitStack() as stack:
        if "jobq" in names:
            served = await stack.enter_async_context(jobq_process(url))
            admin = await asyncpg.connect(dsn, server_settings={"application_name": ORCHESTRATOR})
            stack.push_async_callback(admin.close)
            chosen["jobq"] = JobqSystem(admin, served)
        if "lean" in names:
            chosen["lean"] = await stack.enter_async_context(lean_database(dsn))
        if "pgqueuer" in names:
            from bench import peers  # imports PGQueuer, which only this system needs

            chosen["pgqueuer"] = PgqueuerSystem(await stack.enter_async_context(peers.peer(dsn)))
        yield {name: chosen[name] for name in names}
