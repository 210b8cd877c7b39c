"""The service's error hierarchy, and the one table that maps each error to an HTTP problem (RFC 9457)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import asyncpg
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import DBAPIError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

PROBLEM_JSON = "application/problem+json"

# OpenAPI description of a problem+json answer, for routers' ``responses=``.
PROBLEM: dict[str, Any] = {"content": {PROBLEM_JSON: {}}, "description": "Problem (RFC 9457)"}

logger = logging.getLogger("jobq.errors")


class JobqError(Exception):
    """Base of every error the service raises on purpose; ``status`` and ``title`` come from the table."""

    def __init__(
        self,
        detail: str,
        *,
        errors: Sequence[Mapping[str, Any]] = (),
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(detail)
        self.detail = detail
        self.errors = list(errors)
        self.headers = dict(headers) if headers else None


class NotFound(JobqError):
    """The addressed job (or other resource) does not exist."""


class InvalidTransition(JobqError):
    """The job's current state does not allow the requested operation."""


class QueueNotEmpty(JobqError):
    """A queue cannot be deleted while jobs name it."""


class IdempotencyKeyReused(JobqError):
    """An idempotency key was sent again with a different request.

    ``item`` is the position of the job in the call that reused it (0 for a single enqueue); the
    API names the field from it.
    """

    def __init__(self, detail: str, *, item: int, **kwargs: Any) -> None:
        super().__init__(detail, **kwargs)
        self.item = item


class InvalidInput(JobqError):
    """The request is well-formed JSON but a value is unusable (named in ``errors``)."""


class UnusableValue(InvalidInput):
    """PostgreSQL refused a value as out of range or malformed (a data exception, SQLSTATE 22...)."""


class Unauthenticated(JobqError):
    """No valid API key came with a request that needs one (answered with ``WWW-Authenticate``)."""


class Forbidden(JobqError):
    """The key's role or queue scopes do not allow this request."""


class TooManyFailures(JobqError):
    """This client address failed to authenticate too often; it may try again after ``Retry-After``."""


class UnsupportedMediaType(JobqError):
    """The request's body is in a content type other than JSON."""


class DatabaseUnavailable(JobqError):
    """PostgreSQL could not be reached or gave up; the request may be retried."""


class NotReady(JobqError):
    """The instance should not get traffic: a background loop it runs has stalled."""


class StatementFailed(JobqError):
    """A statement failed in a way that trying it again would repeat (bad data, a constraint, a
    program limit such as the stack depth, a PL/pgSQL exception): its ``sqlstate`` says which.

    Maintenance batches raise it so that they can retry a failed batch one row at a time and set
    aside the row that fails alone; it reaches no route (a 500 if it ever did).
    """

    def __init__(self, detail: str, *, sqlstate: str) -> None:
        super().__init__(detail)
        self.sqlstate = sqlstate


# status, title, type slug
ERROR_TABLE: dict[type[JobqError], tuple[int, str, str]] = {
    NotFound: (404, "Not Found", "not-found"),
    InvalidTransition: (409, "Conflict", "invalid-transition"),
    QueueNotEmpty: (409, "Conflict", "queue-not-empty"),
    IdempotencyKeyReused: (422, "Idempotency key reused", "idempotency-key-reused"),
    InvalidInput: (422, "Unprocessable Content", "validation-error"),
    UnusableValue: (422, "Unprocessable Content", "validation-error"),
    UnsupportedMediaType: (415, "Unsupported Media Type", "unsupported-media-type"),
    Unauthenticated: (401, "Unauthorized", "unauthenticated"),
    Forbidden: (403, "Forbidden", "forbidden"),
    TooManyFailures: (429, "Too Many Requests", "too-many-failures"),
    DatabaseUnavailable: (503, "Service Unavailable", "database-unavailable"),
    NotReady: (503, "Service Unavailable", "not-ready"),
    StatementFailed: (500, "Internal Server Error", "internal"),
}

PROBLEM_TYPE_BASE = "https://jobq.dev/problems/"
VALUE_REFUSED = "a value is out of range or malformed"


def problem(
    status: int,
    title: str,
    detail: str,
    *,
    slug: str | None = None,
    errors: Sequence[Mapping[str, Any]] = (),
    headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    """An RFC 9457 problem+json response."""
    body: dict[str, Any] = {
        "type": PROBLEM_TYPE_BASE + slug if slug else "about:blank",
        "title": title,
        "status": status,
        "detail": detail,
    }
    if errors:
        body["errors"] = list(errors)
    return JSONResponse(body, status_code=status, media_type=PROBLEM_JSON, headers=headers)


def field_name(loc: Sequence[str | int]) -> str:
    """Renders a pydantic location as a dotted field path: ``body.jobs[3].queue``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out


def brief(exc: BaseException) -> str:
    """One line about an error for a log: SQLAlchemy's messages carry the whole statement."""
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {first[:300]}"


# asyncpg's errors that say the connection is gone or unusable, not that a statement failed:
# the backend was terminated (57P01 and its kin, or a closed socket), or the protocol is left
# mid-operation (InternalClientError, "cannot switch to state ...; another operation is in
# progress"). Such a connection must never serve another statement.
CONNECTION_ERRORS: tuple[type[BaseException], ...] = (
    asyncpg.InterfaceError,  # ConnectionDoesNotExistError's kin: "connection is closed"
    asyncpg.InternalClientError,
    asyncpg.PostgresConnectionError,  # SQLSTATE class 08, ConnectionDoesNotExistError
    asyncpg.AdminShutdownError,  # 57P01: pg_terminate_backend, a fast shutdown
    asyncpg.CrashShutdownError,  # 57P02
    asyncpg.CannotConnectNowError,  # 57P03
    OSError,  # ConnectionResetError, BrokenPipeError: the socket itself
)


def connection_lost(exc: BaseException) -> bool:
    """Whether an error (SQLAlchemy's or asyncpg's own) means the connection is gone or unusable."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, CONNECTION_ERRORS):
            return True
        current = getattr(current, "orig", None) or current.__cause__
    return False


def sqlstate(exc: BaseException) -> str | None:
    """The PostgreSQL SQLSTATE behind a SQLAlchemy / asyncpg error, if any."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        code = getattr(current, "sqlstate", None)
        if isinstance(code, str):
            return code
        current = getattr(current, "orig", None) or current.__cause__
    return None


# SQLSTATE classes of a statement that fails again whatever is retried: cardinality (21), data
# (22), constraints (23), triggered data changes (27), routine errors (2F, 38, 39), syntax or
# access (42), check options (44), program limits such as the stack depth (54), PL/pgSQL
# (P0) and internal errors (XX). Not those of a connection (08), a rollback that asks for a retry
# (40: serialization, deadlock), resources (53), a lock or object in use (55) or an operator
# (57: cancels, shutdowns), which a later batch may well not meet.
_REPEATING_CLASSES = frozenset(
    {"21", "22", "23", "27", "2F", "38", "39", "42", "44", "54", "P0", "XX"}
)


@contextlib.contextmanager
def statement_failures() -> Iterator[None]:
    """Raises a database error that a retry would repeat as :class:`StatementFailed`; other
    errors (a lost connection, a deadlock, a timeout) pass unchanged."""
    try:
        yield
    except (DBAPIError, asyncpg.PostgresError) as exc:
        code = sqlstate(exc)
        if code is None or code[:2] not in _REPEATING_CLASSES or connection_lost(exc):
            raise
        raise StatementFailed(_server_message(exc), sqlstate=code) from exc


def _server_message(exc: BaseException) -> str:
    """PostgreSQL's own message behind a driver error (its first line), without the statement."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, asyncpg.PostgresError):
            lines = str(current).strip().splitlines()
            return (lines[0] if lines else type(current).__name__)[:500]
        current = getattr(current, "orig", None) or current.__cause__
    return brief(exc)


@contextlib.contextmanager
def values_refused() -> Iterator[None]:
    """Raises PostgreSQL's data exceptions inside as :class:`UnusableValue`; other errors pass.

    For callers above the services that answer input errors themselves (the dashboard's pages)
    and must not know the driver: the input was unusable, not the server.
    """
    try:
        yield
    except (DBAPIError, asyncpg.PostgresError) as exc:
        if not (sqlstate(exc) or "").startswith("22"):
            raise
        raise UnusableValue(VALUE_REFUSED) from exc


async def _jobq_error(_: Request, exc: Exception) -> JSONResponse:
    if not isinstance(exc, JobqError):  # registered for that type only; never reached
        return await _unexpected_error(_, exc)
    status, title, slug = ERROR_TABLE[type(exc)]
    return problem(status, title, exc.detail, slug=slug, errors=exc.errors, headers=exc.headers)


async def _validation_error(_: Request, exc: Exception) -> JSONResponse:
    if not isinstance(exc, RequestValidationError):  # registered for that type only; never reached
        return await _unexpected_error(_, exc)
    errors = [
        {"field": field_name(err.get("loc", ())), "message": err.get("msg", "invalid")}
        for err in exc.errors()
    ]
    names = ", ".join(dict.fromkeys(e["field"] for e in errors))
    return problem(
        422,
        "Unprocessable Content",
        f"invalid request: {names}",
        slug="validation-error",
        errors=errors,
    )


async def _http_error(_: Request, exc: Exception) -> JSONResponse:
    if not isinstance(exc, StarletteHTTPException):  # registered for that type only; never reached
        return await _unexpected_error(_, exc)
    title = {
        400: "Bad Request",
        404: "Not Found",
        405: "Method Not Allowed",
        413: "Content Too Large",
        415: "Unsupported Media Type",
    }.get(exc.status_code, "Error")
    return problem(exc.status_code, title, str(exc.detail), headers=exc.headers)


def _unavailable() -> JSONResponse:
    return problem(
        503,
        "Service Unavailable",
        "the database is unavailable; retry",
        slug="database-unavailable",
        headers={"Retry-After": "1"},
    )


async def _database_error(_: Request, exc: Exception) -> JSONResponse:
    # SQLAlchemy's errors (reads, ops, maintenance) and asyncpg's own (the hot path) alike.
    if not isinstance(exc, DBAPIError | asyncpg.PostgresError):  # never reached otherwise
        return await _unexpected_error(_, exc)
    code = sqlstate(exc) or ""
    if code.startswith("22"):
        # Data exceptions (out-of-range numbers, bad text): the input was unusable, not the server.
        return problem(
            422,
            "Unprocessable Content",
            VALUE_REFUSED,
            slug="validation-error",
        )
    if code == "23505":
        return problem(409, "Conflict", "a unique value already exists", slug="conflict")
    if code == "23503":
        # A job named in depends_on was deleted between the check and the insert (the insert
        # trigger in app/store/sql/schema/linked.sql refuses it, naming the column).
        column = getattr(exc, "column_name", None) or getattr(
            getattr(exc, "orig", None), "column_name", None
        )
        return problem(
            422,
            "Unprocessable Content",
            "a job named in depends_on does not exist",
            slug="validation-error",
            errors=[{"field": str(column or "depends_on"), "message": "job not found"}],
        )
    invalidated = isinstance(exc, DBAPIError) and exc.connection_invalidated
    if invalidated or connection_lost(exc) or code.startswith("08"):
        return _unavailable()
    return await _unexpected_error(_, exc)


async def _connection_lost(_: Request, exc: Exception) -> JSONResponse:
    # asyncpg's InterfaceError family (a connection closed under a statement), a protocol left
    # mid-operation by a dead backend, and refused connects: the request may be retried.
    return _unavailable()


async def _pool_timeout(_: Request, exc: Exception) -> JSONResponse:
    return problem(
        503,
        "Service Unavailable",
        "no database connection became free in time; retry",
        slug="database-unavailable",
        headers={"Retry-After": "1"},
    )


async def _client_closed(_: Request, exc: Exception) -> JSONResponse:
    # The client went away before its body arrived: nothing ran and nobody reads the answer.
    # 499 (nginx's "client closed request") keeps it out of the server errors and their log.
    return problem(
        499,
        "Client Closed Request",
        "the connection closed before the request body arrived; nothing was done",
        slug="client-closed-request",
    )


async def _unexpected_error(_: Request, exc: Exception) -> JSONResponse:
    logger.error("unhandled error", exc_info=exc)
    return problem(500, "Internal Server Error", "an unexpected error occurred", slug="internal")


def install_error_handlers(app: FastAPI) -> None:
    """Routes every error to problem+json through the table above."""
    for error_type in ERROR_TABLE:
        app.add_exception_handler(error_type, _jobq_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(DBAPIError, _database_error)
    app.add_exception_handler(asyncpg.PostgresError, _database_error)
    app.add_exception_handler(asyncpg.InterfaceError, _connection_lost)
    app.add_exception_handler(asyncpg.InternalClientError, _connection_lost)
    app.add_exception_handler(ConnectionError, _connection_lost)
    app.add_exception_handler(PoolTimeout, _pool_timeout)
    app.add_exception_handler(ClientDisconnect, _client_closed)
    app.add_exception_handler(Exception, _unexpected_error)
