"""What every service method stands on: running a unit of work, telling observers, keyset cursors.

``JobService`` (app/queue/service.py) and the ops methods it inherits (app/queue/operations.py)
run their statements through :class:`ServiceCore`: one conditional statement in autocommit, or
one transaction, retried on deadlock or serialization failure.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, TypeVar

import asyncpg
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine

from app.domain.bounds import MAX_BIGINT
from app.domain.states import Operation, allowed_from
from app.domain.types import JobEvent
from app.errors import CONNECTION_ERRORS, DatabaseUnavailable, InvalidInput, sqlstate
from app.store import Stores
from app.store.conn import Conn, DriverConn, EngineConn

Announce = Callable[[str, int], object]
Observer = Callable[[Sequence[JobEvent]], object]

T = TypeVar("T")

# Deadlock and serialization failures are safe to retry: the statement changed nothing.
_RETRYABLE_SQLSTATES = frozenset({"40P01", "40001"})
TRANSACTION_TRIES = 3


def encode_cursor(job_id: int) -> str:
    """An opaque keyset cursor for the listing."""
    return base64.urlsafe_b64encode(f"v1:{job_id}".encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> int:
    """The job id behind a cursor; a malformed one is a 422 naming ``after``."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode("ascii")
        version, _, value = raw.partition(":")
        job_id = int(value)
        if version != "v1" or not 1 <= job_id <= MAX_BIGINT + 1:
            raise ValueError(raw)
    except (ValueError, UnicodeDecodeError, binascii.Error):
        raise InvalidInput(
            "malformed cursor", errors=[{"field": "query.after", "message": "malformed cursor"}]
        ) from None
    return job_id


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


def valid_id(job_id: int) -> bool:
    return 1 <= job_id <= MAX_BIGINT


def states_of(operation: Operation) -> str:
    return ", ".join(s.value for s in allowed_from(operation))


class ServiceCore:
    """The connections and observers a service runs with (set by ``JobService.__init__``)."""

    engine: AsyncEngine
    autocommit_engine: AsyncEngine
    pool: Any  # the asyncpg pool of the hot statements
    pool_timeout: float
    stores: Stores
    # Called after a commit that made jobs claimable: wakes waiters here and elsewhere.
    announce: Announce
    # Called with the job events of each committed change (metrics, logs); must not block.
    observers: list[Observer]

    async def _run(self, work: Callable[[Conn], Awaitable[T]], *, transaction: bool = False) -> T:
        """Runs a unit of work, retrying deadlocks and serialization failures.

        ``transaction=True`` wraps it in one transaction (commit at the end), for work whose
        statements must stand or fall together. Otherwise each statement commits on its own:
        right for the state changes, which are single conditional statements, and for reads.
        """
        for attempt in range(1, TRANSACTION_TRIES + 1):
            try:
                if transaction:
                    async with self.engine.begin() as conn:
                        return await work(EngineConn(conn))
                async with self.autocommit_engine.connect() as conn:
                    return await work(EngineConn(conn))
            except DBAPIError as exc:
                if sqlstate(exc) in _RETRYABLE_SQLSTATES and attempt < TRANSACTION_TRIES:
                    continue
                raise
        raise RuntimeError("unreachable: the last attempt returns or raises")

    async def _run_hot(
        self,
        work: Callable[[Conn], Awaitable[T]],
        *,
        transaction: bool = False,
        idempotent: bool = False,
    ) -> T:
        """Like :meth:`_run`, on a driver connection: for the statements on the hot path.

        A connection that breaks under ``work`` (its backend terminated, the socket closed, the
        protocol left mid-operation) is terminated, never handed out again. ``work`` then runs
        once more on a fresh connection when that cannot repeat a commit: nothing of it
        reached the server, or it is ``idempotent`` (a read, or a change whose repeat answers
        the same). Otherwise, and when the fresh connection breaks too, the request gets a 503:
        whether its statement committed is unknown, and the client's retry is the one that
        knows what it asked for.
        """
        reconnected = False
        attempt = 1
        while True:
            conn = await self._acquire_hot()
            wire = _wire(conn)
            sent_before = wire.queries_count
            try:
                if transaction:
                    async with conn.transaction():
                        return await work(DriverConn(conn))
                return await work(DriverConn(conn))
            except asyncio.CancelledError:
                # Cancelled mid-statement: the server may still answer on this connection, so
                # it must not serve anyone else.
                conn.terminate()
                raise
            except CONNECTION_ERRORS as exc:
                unsent = wire.queries_count == sent_before
                conn.terminate()
                if reconnected or not (idempotent or unsent):
                    raise _unavailable("the database connection was lost; retry") from exc
                reconnected = True
            except asyncpg.PostgresError as exc:
                if sqlstate(exc) in _RETRYABLE_SQLSTATES and attempt < TRANSACTION_TRIES:
                    attempt += 1
                    continue
                raise
            finally:
                # A terminated connection goes back as a closed one; the pool replaces it.
                await self.pool.release(conn)

    async def _acquire_hot(self) -> Any:
        try:
            return await self.pool.acquire(timeout=self.pool_timeout)
        except TimeoutError:
            raise _unavailable("no database connection became free in time; retry") from None
        except CONNECTION_ERRORS as exc:
            # The pool opens a replacement for a closed connection here: the server refused it.
            raise _unavailable("the database is unavailable; retry") from exc

    def _emit(self, events: Sequence[JobEvent]) -> None:
        if events:
            for observer in self.observers:
                observer(events)

    def _announce_counts(self, queues: Iterable[str]) -> None:
        for queue, count in Counter(queues).items():
            self.announce(queue, count)
