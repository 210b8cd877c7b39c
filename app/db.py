"""Engine factory and URL handling; every connection to PostgreSQL is made here."""

from __future__ import annotations

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
