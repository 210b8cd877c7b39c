"""The maintenance loops' own table (migration 0025): the jobs they set aside."""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    Column,
    DateTime,
    Integer,
    PrimaryKeyConstraint,
    Table,
    Text,
    text,
)

from app.db import metadata

# The loops that move jobs in batches, and may set one aside (app/queue/upkeep.py).
SET_ASIDE_LOOPS = ("reaper", "promoter", "pruner")

# One row per job a loop could not move even alone (a batch failed, then the job alone): the
# loop's batches leave it out until an operator puts it back, so the others proceed.
maintenance_set_aside = Table(
    "maintenance_set_aside",
    metadata,
    Column("loop", Text, nullable=False),
    Column("job_id", BigInteger, nullable=False),
    Column("queue", Text, nullable=True),
    Column("error", Text, nullable=False),
    Column("sqlstate", Text, nullable=True),
    Column("failures", Integer, nullable=False, server_default=text("1")),
    Column(
        "first_failed_at", DateTime(timezone=True), nullable=False, server_default=text("now()")
    ),
    Column("last_failed_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
    PrimaryKeyConstraint("loop", "job_id"),
    CheckConstraint("loop IN (" + ", ".join(f"'{n}'" for n in SET_ASIDE_LOOPS) + ")", name="loop"),
    comment=(
        "Jobs a maintenance loop could not move even alone: left out of its batches, with the "
        "error, until an operator puts them back (DELETE /v1/maintenance/set-aside/{loop}/{job_id})."
    ),
)
