"""Concurrency and rate limits as operators manage them: list, set, delete, prune idle state.

``flow_*`` (flow_limits, flow_state, flow_keys, flow_active) is the code's word for what the API
and the docs call limits (docs/architecture/glossary.md).

The limits are enforced by the claim statement itself (``job_claim`` in sql/jobs.sql), so they
hold across every instance. A limit covers a key pattern (``customer:*``: each matching
``concurrency_key`` on its own) or a queue pattern (each matching queue on its own); of several
matching patterns of one scope, the longest applies. A job may meet one key limit and one queue
limit, and runs only within both. A key's jobs are counted per queue (``customer:42`` in
queue ``a`` and in queue ``b`` hold slots of their own), so a producer that may write to one
queue cannot use up the slots or tokens another queue's jobs depend on.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from app.domain.bounds import valid_id
from app.domain.records import FlowLimit, FlowLimitSet, FlowLimitUse
from app.errors import NotFound
from app.queue.events import Events
from app.queue.waiters import ALL_QUEUES
from app.store import Stores
from app.store.unit import UnitOfWork

SCOPES = ("key", "queue")
# A flow_state row with nothing running, untouched this long (and past its bucket's refill
# time), is deleted by the pruner; the next claim that needs it creates it again.
FLOW_IDLE_SECONDS = 300.0
# Pending jobs counted per blocked key or queue for the held-back gauge: a bounded read however
# deep a backlog grows.
HELD_BACK_CAP = 100_000


def like_pattern(glob: str) -> str:
    """A limit's pattern as SQL LIKE: ``*`` matches any run of characters, all else itself."""
    return glob.replace("\\", "\\\\").replace("_", "\\_").replace("%", "\\%").replace("*", "%")


class LimitsService:
    """Lists, sets and deletes limits, auditing each change."""

    def __init__(self, *, unit: UnitOfWork, stores: Stores, events: Events) -> None:
        self.unit = unit
        self.stores = stores
        self.events = events

    async def list_all(self) -> list[FlowLimitUse]:
        """Every limit, by scope and pattern, with the jobs running under it now."""
        async for attempt in self.unit.ops():
            async with attempt as conn:
                rows = await self.stores.flow_limits.flow_limit_list(conn)
        return rows

    async def held_back(self, *, cap: int = HELD_BACK_CAP) -> dict[int, int]:
        """Per limit id, the pending jobs it holds back now: in keys or queues at their
        max_running or with an empty bucket (each counted up to ``cap``)."""
        async for attempt in self.unit.ops():
            async with attempt as conn:
                counts = await self.stores.flow_limits.flow_limit_held_back(conn, cap=cap)
        return counts

    async def put(
        self,
        *,
        scope: str,
        pattern: str,
        max_running: int | None,
        rate_limit: int | None,
        rate_per_seconds: float | None,
        actor: str,
        actor_key_id: int | None,
    ) -> FlowLimitSet:
        """Creates or replaces the limit of (scope, pattern); the row carries ``created``."""

        async for attempt in self.unit.ops(transaction=True):
            async with attempt as conn:
                row = await self.stores.flow_limits.flow_limit_set(
                    conn,
                    scope=scope,
                    pattern=pattern,
                    like_pattern=like_pattern(pattern),
                    max_running=max_running,
                    rate_limit=rate_limit,
                    rate_per_seconds=rate_per_seconds,
                )
                await self.stores.audit.audit_insert(
                    conn,
                    actor=actor,
                    actor_key_id=actor_key_id,
                    action="limit.set",
                    outcome="changed",
                    detail=_detail(row),
                )
        # A raised limit may let parked claims, here and on other instances, take jobs at once.
        self.events.wake(ALL_QUEUES, 1)
        return row

    async def delete(self, limit_id: int, *, actor: str, actor_key_id: int | None) -> FlowLimit:
        """Deletes one limit (``NotFound`` if unknown); jobs it held back may run at once."""
        if not valid_id(limit_id):
            raise NotFound(f"limit {limit_id} not found")

        async for attempt in self.unit.ops(transaction=True):
            async with attempt as conn:
                row = await self.stores.flow_limits.flow_limit_delete(conn, limit_id=limit_id)
                if row is not None:
                    await self.stores.audit.audit_insert(
                        conn,
                        actor=actor,
                        actor_key_id=actor_key_id,
                        action="limit.delete",
                        outcome="changed",
                        detail=_detail(row),
                    )
        if row is None:
            raise NotFound(f"limit {limit_id} not found")
        self.events.wake(ALL_QUEUES, 1)
        return row

    async def prune_state(
        self,
        *,
        batch_size: int,
        idle_seconds: float = FLOW_IDLE_SECONDS,
        now: datetime | None = None,
    ) -> int:
        """Folds the slots given back to at most ``batch_size`` keys that no claim folded, then
        deletes at most ``batch_size`` idle flow_state rows; answers how many rows it deleted."""

        async for attempt in self.unit.ops():
            async with attempt as conn:
                await self.stores.flow_limits.flow_released_fold(conn, batch_size=batch_size)
                pruned = await self.stores.flow_limits.flow_state_prune(
                    conn, batch_size=batch_size, idle_seconds=idle_seconds, now=now
                )
        return pruned


def _detail(row: FlowLimit) -> dict[str, Any]:
    return {
        "id": row.id,
        "scope": row.scope,
        "pattern": row.pattern,
        "max_running": row.max_running,
        "rate_limit": row.rate_limit,
        "rate_per_seconds": row.rate_per_seconds,
    }
