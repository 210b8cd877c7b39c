"""The tables of composing work (migration 0021): workflows and the ordering keys' locks."""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Column,
    DateTime,
    Identity,
    Index,
    Integer,
    PrimaryKeyConstraint,
    Table,
    Text,
    text,
)

from app.db import metadata

# One row per POST /v1/workflows (migration 0021): its steps are jobs with its workflow_id.
workflows = Table(
    "workflows",
    metadata,
    Column("id", BigInteger, Identity(always=True), primary_key=True),
    Column("name", Text, nullable=False),
    Column("steps", Integer, nullable=False),
    Column("created_by", Text, nullable=True),
    Column("created_by_key_id", BigInteger, nullable=True),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
    # The create's idempotency key and its request's fingerprint (migration 0026): one workflow
    # per key, remembered as long as the row.
    Column("idempotency_key", Text, nullable=True),
    Column("idempotency_hash", Text, nullable=True),
    Index("ix_workflows_created_at", "created_at"),
    Index(
        "uq_workflows_idempotency_key",
        "idempotency_key",
        unique=True,
        postgresql_where=text("idempotency_key IS NOT NULL"),
    ),
)

# One row per (queue, ordering key) (migration 0021): the lock a key's enqueues and finishes
# take turns on (the triggers in app/store/sql/schema/linked.sql), so two jobs of a key never both start.
ordering_keys = Table(
    "ordering_keys",
    metadata,
    Column("queue", Text, nullable=False),
    Column("ordering_key", Text, nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
    PrimaryKeyConstraint("queue", "ordering_key"),
    Index("ix_ordering_keys_updated_at", "updated_at"),
)
