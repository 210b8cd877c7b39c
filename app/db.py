"""Engine and driver-pool factories and URL handling; every connection to PostgreSQL is made here.

Two pools: the SQLAlchemy engine (reads, ops actions, maintenance, migrations) and an asyncpg
pool for the statements on the hot path (enqueue, claim, lease calls), which run prepared on the
driver with its statement cache and none of SQLAlchemy's per-call machinery (measured: about
half the CPU per statement). Both connect as ``application_name = 'jobq'``.
"""

from __future__ import annotations

from typing import Any

import asyncpg
import orjson
from sqlalchemy import MetaData
from sqlalchemy.engine import URL, make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

metadata = MetaData(naming_convention=NAMING_CONVENTION)


def async_url(url: str) -> URL:
    """Turns any PostgreSQL URL (``postgres://``, ``postgresql://``, ``+psycopg``) into an asyncpg one."""
    parsed = make_url(url.replace("postgres://", "postgresql://", 1))
    if parsed.get_backend_name() != "postgresql":
        raise ValueError(f"jobq needs a PostgreSQL URL, got backend {parsed.get_backend_name()!r}")
    return parsed.set(drivername="postgresql+asyncpg")


def create_engine(
    url: str, *, pool_size: int, max_overflow: int, pool_timeout: float
) -> AsyncEngine:
    """Creates the async engine the service and its loops share.

    A fixed pool (no overflow) makes requests queue for a connection instead of opening and
    closing overflow connections under load, which was measured to cost more than the work.
    There is no pre-ping (a round trip on every checkout): a connection found dead fails its
    request with a 503 and SQLAlchemy invalidates the pool, so the next requests reconnect.
    """
    return create_async_engine(
        async_url(url),
        pool_size=pool_size,
        max_overflow=max_overflow,
        pool_timeout=pool_timeout,
        # Each pooled connection identifies itself in pg_stat_activity.
        connect_args={"server_settings": {"application_name": "jobq"}},
    )


def driver_dsn(url: str) -> str:
    """The same server as a DSN asyncpg itself takes (no SQLAlchemy driver suffix)."""
    return async_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def _encode_jsonb(value: bytes | str) -> bytes:
    # Parameters arrive as JSON text already (app.queue.repository.to_json); jsonb's binary
    # format is a version byte, then that text.
    return b"\x01" + (value if isinstance(value, bytes) else value.encode())


def _decode_jsonb(data: bytes) -> Any:
    return orjson.loads(data[1:])


async def _setup_connection(conn: Any) -> None:
    await conn.set_type_codec(
        "jsonb", schema="pg_catalog", encoder=_encode_jsonb, decoder=_decode_jsonb, format="binary"
    )


async def _keep_as_is(conn: Any) -> None:
    """Release without asyncpg's reset query (a round trip per request).

    Nothing on these connections changes session state: no SET, LISTEN or advisory lock (those
    live on the control connection), and transactions end inside their block. A connection whose
    statement was cancelled is terminated by its user instead of being released.
    """


async def create_driver_pool(url: str, *, size: int, application_name: str = "jobq") -> Any:
    """An asyncpg pool of ``size`` connections whose jsonb values are JSON text in, Python out."""
    return await asyncpg.create_pool(
        driver_dsn(url),
        min_size=size,
        max_size=size,
        init=_setup_connection,
        reset=_keep_as_is,
        server_settings={"application_name": application_name},
    )
