"""Seeding helpers for integration tests (plain SQL is fine in tests)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from datetime import datetime
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.domain.types import JobDefaults
from app.migrations import upgrade
from app.queue.services import Services, build_services
from app.settings import Settings
from app.store import Stores, stores_for
from app.store.unit import UnitOfWork
from tests.conftest import create_database, drop_database


def stores() -> Stores:
    """The stores with the default settings' policies."""
    return stores_for(Settings(database_url="postgresql://unused/unused"))


def service(engine: AsyncEngine, pool: Any, **options: Any) -> Services:
    """The services on the engine and driver pool with the default settings (no waiters)."""
    defaults = Settings(database_url="postgresql://unused/unused")
    return build_services(
        unit=UnitOfWork(engine=engine, pool=pool),
        stores=stores(),
        defaults=JobDefaults(
            max_attempts=defaults.max_attempts_default,
            lease_seconds=defaults.lease_seconds_default,
        ),
        **options,
    )


async def db_now(engine: AsyncEngine) -> datetime:
    """The database's clock: the reference for exact deadlines."""
    async with engine.connect() as conn:
        value: datetime = (await conn.execute(text("SELECT now()"))).scalar_one()
        return value


async def seed_jobs(engine: AsyncEngine, count: int, **columns: Any) -> list[int]:
    """Inserts ``count`` pending jobs (columns override defaults); answers their ids."""
    values = {"queue": "default", "type": "t", "max_attempts": 10, "lease_seconds": 30, **columns}
    names = ", ".join(values)
    binds = ", ".join(f":{k}" for k in values)
    async with engine.begin() as conn:
        result = await conn.execute(
            text(
                f"INSERT INTO jobs ({names}) SELECT {binds} FROM generate_series(1, :n) "
                "RETURNING id"
            ),
            {**values, "n": count},
        )
        return [row[0] for row in result]


async def set_columns(engine: AsyncEngine, ids: list[int], **columns: Any) -> None:
    """Sets columns of the given jobs (values are binds)."""
    assignments = ", ".join(f"{k} = :{k}" for k in columns)
    async with engine.begin() as conn:
        await conn.execute(
            text(f"UPDATE jobs SET {assignments} WHERE id = ANY(:ids)"), {**columns, "ids": ids}
        )


async def job_row(engine: AsyncEngine, job_id: int) -> dict[str, Any]:
    async with engine.connect() as conn:
        row = await conn.execute(text("SELECT * FROM jobs WHERE id = :id"), {"id": job_id})
        return dict(row.mappings().one())


# Plan tests run on the session's server and, when set, on JOBQ_PLAN_DATABASE_URL's (.ci/run
# points it at PostgreSQL 15, where no skip scan hides a plan that walks a whole index).
PLAN_SERVERS = [
    "session",
    *(["JOBQ_PLAN_DATABASE_URL"] if os.environ.get("JOBQ_PLAN_DATABASE_URL") else []),
]


def migrated_database(server_param: str, pg_server_url: str, prefix: str) -> Iterator[str]:
    """A fresh migrated database on the plan server ``server_param`` names; dropped after."""
    server = pg_server_url if server_param == "session" else os.environ[server_param]
    url = create_database(server, prefix=prefix)
    upgrade(url)
    yield url
    drop_database(server, url)
