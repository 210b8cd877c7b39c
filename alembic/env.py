"""Alembic environment: async (asyncpg), URL from the caller or DATABASE_URL, one migrator at a time."""

from __future__ import annotations

import asyncio
import os
from logging.config import fileConfig

from alembic import context
from sqlalchemy import text
from sqlalchemy.engine import Connection

from app.db import async_url, create_admin_engine
from app.models import metadata

config = context.config
if config.config_file_name is not None and not config.attributes.get("skip_logging_config"):
    fileConfig(config.config_file_name, disable_existing_loggers=False)

# Several instances may start at once; they queue on this transaction-level lock.
MIGRATION_LOCK_KEY = 0x6A6F6272


def _database_url() -> str:
    url = config.attributes.get("database_url") or os.environ.get("DATABASE_URL")
    if not url:
        raise RuntimeError("set DATABASE_URL (or run `jobq migrate`)")
    return str(url)


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=metadata,
        compare_server_default=True,
        transaction_per_migration=False,
    )
    with context.begin_transaction():
        connection.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": MIGRATION_LOCK_KEY})
        context.run_migrations()


async def _run_online() -> None:
    # Host by host through a listed set (a failover), with asyncpg's statement cache.
    engine = create_admin_engine(_database_url())
    try:
        async with engine.connect() as connection:
            await connection.run_sync(_run)
            await connection.commit()
    finally:
        await engine.dispose()


if context.is_offline_mode():
    context.configure(
        url=str(async_url(_database_url())), target_metadata=metadata, literal_binds=True
    )
    with context.begin_transaction():
        context.run_migrations()
else:
    asyncio.run(_run_online())
