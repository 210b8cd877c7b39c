"""The ``api_keys`` table's statements: create, list, revoke, and the reads the key cache makes.

Creating or revoking a key notifies ``jobq_keys`` in the same transaction, so every instance
listening on its control connection reloads its cache as soon as the change commits; the same
transaction records the operation in ``audit_log``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import exists, func, insert, select, text, update
from sqlalchemy.ext.asyncio import AsyncConnection

from app.auth.keys import Principal, Role, digest, new_secret
from app.models import api_keys, audit_log

CHANNEL = "jobq_keys"

# Who the audit trail names for a key operation called with no actor (tests, tools); the CLI
# names "cli:<OS user>".
INTERNAL_ACTOR = "internal"

# What a principal is made of: the key's id, name, role and queue scopes.
_PRINCIPAL_COLUMNS = (api_keys.c.id, api_keys.c.name, api_keys.c.role, api_keys.c.queues)


@dataclass(frozen=True)
class KeyInfo:
    """A key as ``jobq keys list`` shows it (never the secret, nor its hash)."""

    id: int
    name: str
    role: str
    queues: tuple[str, ...] | None
    created_at: datetime
    revoked_at: datetime | None


def _principal(row: Any) -> Principal:
    return Principal(
        key_id=row.id,
        name=row.name,
        role=Role(row.role),
        queues=tuple(row.queues) if row.queues is not None else None,
    )


async def _notify(conn: AsyncConnection) -> None:
    await conn.execute(text("SELECT pg_notify(:channel, '')"), {"channel": CHANNEL})


async def _audit(
    conn: AsyncConnection,
    *,
    action: str,
    outcome: str,
    name: str,
    actor: str,
    before: str | None = None,
    after: str | None = None,
    detail: dict[str, Any] | None = None,
) -> None:
    await conn.execute(
        insert(audit_log).values(
            actor=actor,
            action=action,
            outcome=outcome,
            key_name=name,
            state_before=before,
            state_after=after,
            detail=detail,
        )
    )


async def create_key(
    conn: AsyncConnection,
    *,
    name: str,
    role: Role,
    queues: Sequence[str] | None,
    actor: str = INTERNAL_ACTOR,
) -> str:
    """Stores a new key, recording ``actor`` made it, and answers its secret (shown only here).

    A taken name raises the database's unique violation (SQLSTATE 23505); the caller may record
    the refusal with :func:`record_refused_create` in a transaction of its own.
    """
    key_id = (
        await conn.execute(text("SELECT nextval(pg_get_serial_sequence('api_keys', 'id'))"))
    ).scalar_one()
    secret = new_secret(int(key_id))
    await conn.execute(
        text(
            "INSERT INTO api_keys (id, name, role, queues, secret_sha256) OVERRIDING SYSTEM VALUE "
            "VALUES (:id, :name, :role, :queues, :digest)"
        ),
        {
            "id": key_id,
            "name": name,
            "role": role.value,
            "queues": list(queues) if queues is not None else None,
            "digest": digest(secret),
        },
    )
    await _audit(
        conn,
        action="key.create",
        outcome="changed",
        name=name,
        actor=actor,
        after="live",
        detail=_key_detail(role, queues),
    )
    await _notify(conn)
    return secret


def _key_detail(role: Role, queues: Sequence[str] | None) -> dict[str, Any]:
    return {"role": role.value, "queues": list(queues) if queues is not None else None}


async def record_refused_create(
    conn: AsyncConnection,
    *,
    name: str,
    role: Role,
    queues: Sequence[str] | None,
    actor: str = INTERNAL_ACTOR,
) -> None:
    """Records an attempt to create a key under a taken name (it changed nothing)."""
    await _audit(
        conn,
        action="key.create",
        outcome="refused",
        name=name,
        actor=actor,
        detail=_key_detail(role, queues),
    )


async def list_keys(conn: AsyncConnection) -> list[KeyInfo]:
    """Every key, revoked ones included, oldest first."""
    rows = await conn.execute(
        select(*_PRINCIPAL_COLUMNS, api_keys.c.created_at, api_keys.c.revoked_at).order_by(
            api_keys.c.id
        )
    )
    return [
        KeyInfo(
            id=r.id,
            name=r.name,
            role=r.role,
            queues=tuple(r.queues) if r.queues is not None else None,
            created_at=r.created_at,
            revoked_at=r.revoked_at,
        )
        for r in rows
    ]


async def revoke_key(conn: AsyncConnection, *, name: str, actor: str = INTERNAL_ACTOR) -> bool:
    """Revokes a key by name; answers whether a live key of that name existed.

    Records the attempt, ``actor`` naming who made it: revoked, or refused (no live key).
    """
    result = await conn.execute(
        update(api_keys)
        .where(api_keys.c.name == name, api_keys.c.revoked_at.is_(None))
        .values(revoked_at=func.now())
        .returning(api_keys.c.id)
    )
    revoked = result.first() is not None
    if revoked:
        await _audit(
            conn,
            action="key.revoke",
            outcome="changed",
            name=name,
            actor=actor,
            before="live",
            after="revoked",
        )
        await _notify(conn)
    else:
        await _audit(conn, action="key.revoke", outcome="refused", name=name, actor=actor)
    return revoked


async def live_keys(conn: AsyncConnection) -> tuple[dict[bytes, Principal], bool]:
    """The keys not revoked, by secret hash, and whether any key (revoked or not) exists."""
    rows = await conn.execute(
        select(*_PRINCIPAL_COLUMNS, api_keys.c.secret_sha256).where(api_keys.c.revoked_at.is_(None))
    )
    live = {bytes(r.secret_sha256): _principal(r) for r in rows}
    any_key = bool(live) or bool((await conn.execute(select(exists(api_keys.select())))).scalar())
    return live, any_key


async def key_by_digest(conn: AsyncConnection, secret_digest: bytes) -> Principal | None:
    """The live key with this secret hash, if any (for a key made after the cache was loaded)."""
    row = (
        await conn.execute(
            select(*_PRINCIPAL_COLUMNS).where(
                api_keys.c.secret_sha256 == secret_digest, api_keys.c.revoked_at.is_(None)
            )
        )
    ).first()
    return _principal(row) if row is not None else None


async def any_keys(conn: AsyncConnection) -> bool:
    """Whether any key was ever made (revoked ones count: revoking every key keeps auth on)."""
    return bool((await conn.execute(select(exists(api_keys.select())))).scalar())
