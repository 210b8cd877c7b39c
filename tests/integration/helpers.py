"""Seeding helpers for integration tests (plain SQL is fine in tests)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.queue.repository import BackoffPolicy, Repository


def repository() -> Repository:
    return Repository(backoff=BackoffPolicy())


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


async def job_row(engine: AsyncEngine, job_id: int) -> dict[str, Any]:
    async with engine.connect() as conn:
        row = await conn.execute(text("SELECT * FROM jobs WHERE id = :id"), {"id": job_id})
        return dict(row.mappings().one())
