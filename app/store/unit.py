"""The unit of work every service runs its statements in: a connection, a transaction, retries.

A service method opens one and runs its statements inside::

    async for attempt in self.unit.hot(idempotent=True):
        async with attempt as conn:
            row = await self.stores.jobs.job_get(conn, job_id=job_id)

Each ``attempt`` is a context manager that hands out a connection and, on leaving, commits (or
rolls back), gives the connection back and judges an error: a deadlock or serialization
failure runs the block again on a fresh attempt (the statement changed nothing), as does a
connection lost before anything reached the server; every other error leaves as it came. The
loop ends after the first attempt that succeeds. Nothing is handed down as a closure, and a
request enters its service once.

``hot`` runs on the asyncpg pool (the hot statements, prepared per connection); ``ops`` on
SQLAlchemy's engine (reads and admin actions). ``transaction=True`` makes the block one
transaction, for statements that must stand or fall together; otherwise each statement
commits on its own (autocommit: one round trip instead of BEGIN, statement, COMMIT), which is
right for the state changes, single conditional statements each, and for reads.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from types import TracebackType
from typing import Any

import asyncpg
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine

from app.errors import CONNECTION_ERRORS, DatabaseUnavailable, sqlstate
from app.store.conn import Conn, DriverConn, EngineConn

# Deadlock and serialization failures are safe to retry: the statement changed nothing.
_RETRYABLE_SQLSTATES = frozenset({"40P01", "40001"})
TRANSACTION_TRIES = 3


# What the server answers a statement it refused with. In autocommit nothing of that statement
# stayed: the caller may run the same work another way (app/queue/chained.py).
STATEMENT_REFUSED: type[Exception] = asyncpg.PostgresError


class UnitOfWork:
    """The connections the services run on, and how a unit of work is begun, retried and ended."""

    def __init__(self, *, engine: AsyncEngine, pool: Any, pool_timeout: float = 10.0) -> None:
        self.engine = engine
        self.autocommit_engine = engine.execution_options(isolation_level="AUTOCOMMIT")
        # The asyncpg pool for the hot statements (app/db.py says why there are two).
        self.pool = pool
        self.pool_timeout = pool_timeout
        # Hot statements run, per kind (enqueue, claim, lease_complete ...), for /metrics.
        self.statements: Counter[str] = Counter()

    def hot(self, *, transaction: bool = False, idempotent: bool = False) -> HotAttempts:
        """Attempts on a driver connection from the hot pool.

        A connection that breaks under the block (its backend terminated, the socket closed,
        the protocol left mid-operation) is terminated, never handed out again. The block then
        runs once more on a fresh connection when that cannot repeat a commit: nothing of it
        reached the server, or it is ``idempotent`` (a read, or a change whose repeat answers
        the same). Otherwise, and when the fresh connection breaks too, the request gets a 503:
        whether its statement committed is unknown, and the client's retry is the one that
        knows what it asked for.
        """
        return HotAttempts(self, transaction=transaction, idempotent=idempotent)

    def ops(self, *, transaction: bool = False) -> OpsAttempts:
        """Attempts on a SQLAlchemy connection, retried on deadlock or serialization failure."""
        return OpsAttempts(self, transaction=transaction)

    async def acquire_hot(self) -> Any:
        """A driver connection from the hot pool; 503 when none comes free or the server refuses."""
        try:
            return await self.pool.acquire(timeout=self.pool_timeout)
        except TimeoutError:
            raise _unavailable("no database connection became free in time; retry") from None
        except CONNECTION_ERRORS as exc:
            # The pool opens a replacement for a closed connection here: the server refused it.
            raise _unavailable("the database is unavailable; retry") from exc


class HotAttempts:
    """The attempts of one unit of work on the hot pool (see :meth:`UnitOfWork.hot`)."""

    def __init__(self, unit: UnitOfWork, *, transaction: bool, idempotent: bool) -> None:
        self.unit = unit
        self.transaction = transaction
        self.idempotent = idempotent
        self.done = False
        self.reconnected = False
        self.tries = 1

    def __aiter__(self) -> HotAttempts:
        return self

    async def __anext__(self) -> HotAttempt:
        if self.done:
            raise StopAsyncIteration
        return HotAttempt(self)


class HotAttempt:
    """One try: a pooled driver connection, in a transaction when asked, judged on the way out."""

    def __init__(self, attempts: HotAttempts) -> None:
        self.attempts = attempts
        self.conn: Any = None
        self.wire: Any = None
        self.sent_before = 0
        self.tx: Any = None

    async def __aenter__(self) -> Conn:
        unit = self.attempts.unit
        while True:
            self.conn = await unit.acquire_hot()
            self.wire = _wire(self.conn)
            self.sent_before = self.wire.queries_count
            if not self.attempts.transaction:
                return DriverConn(self.conn)
            self.tx = self.conn.transaction()
            try:
                await self.tx.start()
                return DriverConn(self.conn)
            except (asyncio.CancelledError, *CONNECTION_ERRORS, asyncpg.PostgresError) as error:
                # BEGIN failed: judged as the block's error would be, on a fresh connection.
                self.tx = None
                try:
                    retry = self._judge(error)
                finally:
                    await unit.pool.release(self.conn)
                if not retry:
                    raise

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        error = exc
        try:
            if self.tx is not None:
                try:
                    # Commits, or rolls back when the block failed.
                    await self.tx.__aexit__(exc_type, exc, tb)
                except (asyncio.CancelledError, *CONNECTION_ERRORS, asyncpg.PostgresError) as end:
                    error = end
            retry = self._judge(error)
            if error is not None and error is not exc and not retry:
                raise error
            return retry
        finally:
            # A terminated connection goes back as a closed one; the pool replaces it.
            await self.attempts.unit.pool.release(self.conn)

    def _judge(self, error: BaseException | None) -> bool:
        """Whether the block runs again; raises the 503 for a lost connection it cannot retry."""
        attempts = self.attempts
        if error is None:
            attempts.done = True
            return False
        if isinstance(error, asyncio.CancelledError):
            # Cancelled mid-statement: the server may still answer on this connection, so it
            # must not serve anyone else.
            self.conn.terminate()
            return False
        if isinstance(error, CONNECTION_ERRORS):
            unsent = self.wire.queries_count == self.sent_before
            self.conn.terminate()
            if attempts.reconnected or not (attempts.idempotent or unsent):
                raise _unavailable("the database connection was lost; retry") from error
            attempts.reconnected = True
            return True
        if (
            isinstance(error, asyncpg.PostgresError)
            and sqlstate(error) in _RETRYABLE_SQLSTATES
            and attempts.tries < TRANSACTION_TRIES
        ):
            attempts.tries += 1
            return True
        return False


class OpsAttempts:
    """The attempts of one unit of work on SQLAlchemy's engine (see :meth:`UnitOfWork.ops`)."""

    def __init__(self, unit: UnitOfWork, *, transaction: bool) -> None:
        self.unit = unit
        self.transaction = transaction
        self.done = False
        self.tries = 1

    def __aiter__(self) -> OpsAttempts:
        return self

    async def __anext__(self) -> OpsAttempt:
        if self.done:
            raise StopAsyncIteration
        return OpsAttempt(self)


class OpsAttempt:
    """One try: a connection in autocommit, or one transaction committed on the way out."""

    def __init__(self, attempts: OpsAttempts) -> None:
        self.attempts = attempts
        unit = attempts.unit
        self.context = (
            unit.engine.begin() if attempts.transaction else unit.autocommit_engine.connect()
        )

    async def __aenter__(self) -> Conn:
        return EngineConn(await self.context.__aenter__())

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        error = exc
        try:
            # Commits, or rolls back when the block failed; closes the connection.
            await self.context.__aexit__(exc_type, exc, tb)
        except DBAPIError as end:
            error = end
        attempts = self.attempts
        if error is None:
            attempts.done = True
            return False
        if (
            isinstance(error, DBAPIError)
            and sqlstate(error) in _RETRYABLE_SQLSTATES
            and attempts.tries < TRANSACTION_TRIES
        ):
            attempts.tries += 1
            return True
        if error is not exc:
            raise error
        return False


def _unavailable(detail: str) -> DatabaseUnavailable:
    return DatabaseUnavailable(detail, headers={"Retry-After": "1"})


def _wire(conn: Any) -> Any:
    """The asyncpg protocol under a pooled connection, kept for after the pool detaches it.

    Its ``queries_count`` counts a statement once its Bind and Execute are written, not before;
    the state check that refuses a connection left mid-operation by a dead backend comes first.
    So an unchanged count after an error means nothing of the work reached the server. (The
    pool reads the same counter for ``max_queries``.)
    """
    return conn._protocol
