"""The table of completion webhooks (migration 0020): one delivery per finish of a job with a callback."""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    Column,
    DateTime,
    Index,
    Integer,
    Table,
    Text,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB, UUID

from app.db import metadata

# One row per finish of a job with a callback (since migration 0020), written by a trigger (app/store/sql/schema/finished.sql) with the
# outcome (body); app/maintenance/webhooks.py sends it. No foreign key: it outlives its job.
webhook_deliveries = Table(
    "webhook_deliveries",
    metadata,
    Column("id", UUID(as_uuid=True), primary_key=True, server_default=text("gen_random_uuid()")),
    Column("job_id", BigInteger, nullable=False),
    Column("url", Text, nullable=False),
    Column("key_id", BigInteger, nullable=True),
    Column("body", JSONB, nullable=False),
    Column("state", Text, nullable=False, server_default=text("'pending'")),
    Column("attempts", Integer, nullable=False, server_default=text("0")),
    Column(
        "next_attempt_at", DateTime(timezone=True), nullable=False, server_default=text("now()")
    ),
    Column("last_status", Integer, nullable=True),
    Column("last_error", Text, nullable=True),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
    Column("delivered_at", DateTime(timezone=True), nullable=True),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
    CheckConstraint("state IN ('pending', 'delivered', 'failed')", name="state"),
    CheckConstraint("attempts >= 0", name="attempts"),
    Index(
        "ix_webhook_deliveries_due", "next_attempt_at", postgresql_where=text("state = 'pending'")
    ),
    Index("ix_webhook_deliveries_job_id", "job_id"),
    Index("ix_webhook_deliveries_done", "updated_at", postgresql_where=text("state <> 'pending'")),
)
