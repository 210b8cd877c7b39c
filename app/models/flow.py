"""The tables of concurrency keys and rate limits (migration 0011): the limits and their state.

``flow_*`` is the code's word for what the API and the docs call limits."""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    Computed,
    DateTime,
    Float,
    Identity,
    Index,
    Integer,
    Table,
    Text,
    UniqueConstraint,
    text,
)

from app.db import metadata

# Flow limits (migration 0011), set by operators: per key pattern or queue pattern (a glob, kept
# with its LIKE form), a max_running and/or a token bucket of rate_limit claims per
# rate_per_seconds. The most specific (longest) matching pattern of each scope applies.
flow_limits = Table(
    "flow_limits",
    metadata,
    Column("id", BigInteger, Identity(always=True), primary_key=True),
    Column("scope", Text, nullable=False),
    Column("pattern", Text, nullable=False),
    Column("like_pattern", Text, nullable=False),
    Column("max_running", Integer, nullable=True),
    Column("rate_limit", Integer, nullable=True),
    Column("rate_per_seconds", Float, nullable=True),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
    CheckConstraint("scope IN ('key', 'queue')", name="scope"),
    CheckConstraint("max_running IS NOT NULL OR rate_limit IS NOT NULL", name="some"),
    CheckConstraint("(rate_limit IS NULL) = (rate_per_seconds IS NULL)", name="rate"),
    CheckConstraint("max_running >= 1", name="max_running"),
    CheckConstraint("rate_limit >= 1 AND rate_per_seconds > 0", name="rate_positive"),
    UniqueConstraint("scope", "pattern"),
)

# One row per limited key in a queue ("key:<queue>|<concurrency_key>": since 0014 a key is
# counted per queue) or per limited queue ("queue:<name>"), written only by the claim statement
# (which locks it FOR UPDATE in key order) and by the trigger that gives running slots back; the
# limit columns repeat what the last claim applied.
flow_state = Table(
    "flow_state",
    metadata,
    Column("key", Text, primary_key=True),
    Column("running", Integer, nullable=False, server_default=text("0")),
    Column("max_running", Integer, nullable=True),
    Column("rate_limit", Integer, nullable=True),
    Column("rate_per_seconds", Float, nullable=True),
    Column("tokens", Float, nullable=True),
    # At its max_running now, and when an emptied bucket has a whole token again: what a claim
    # skips before it locks anything (partial indexes: only such rows).
    Column("at_limit", Boolean, Computed("running >= max_running", persisted=True)),
    Column("blocked_until", DateTime(timezone=True), nullable=True),
    Column("refilled_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
    CheckConstraint("running >= 0", name="running"),
    Index("ix_flow_state_at_limit", "key", postgresql_where=text("at_limit")),
    Index(
        "ix_flow_state_blocked_until",
        "blocked_until",
        postgresql_where=text("blocked_until IS NOT NULL"),
    ),
)

# Running slots given back (migration 0023): a job leaving running appends a row per key instead
# of locking the key's flow_state row, so releases never wait for claims. The claim that next
# locks the row deletes its rows and counts running - released; view flow_running sums the rest.
flow_released = Table(
    "flow_released",
    metadata,
    Column("key", Text, nullable=False),
    Column("n", Integer, nullable=False),
    CheckConstraint("n > 0", name="n"),
    Index("ix_flow_released_key", "key"),
)
