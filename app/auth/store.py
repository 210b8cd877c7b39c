"""API keys: create, list, revoke, and the reads the key cache makes, over KeyStore and AuditStore.

Creating or revoking a key notifies ``jobq_keys`` in the same transaction, so every instance
listening on its control connection reloads its cache as soon as the change commits; the same
transaction records the operation in ``audit_log``. Callers hand a connection of either driver
(or a store ``Conn``) and own the transaction; the SQL is app/store/sql/keys.sql.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from app.auth.keys import Principal, Role, digest, new_secret
from app.domain.records import KeyPrincipal
from app.domain.webhook_records import WebhookSecretRow
from app.domain.webhooks import new_webhook_secret
from app.store.audit import AuditStore
from app.store.conn import Conn
from app.store.keys import KeyStore
from app.store.webhooks import WebhookStore

CHANNEL = "jobq_keys"

# Who the audit trail names for a key operation called with no actor (tests, tools); the CLI
# names "cli:<OS user>".
INTERNAL_ACTOR = "internal"

_KEYS = KeyStore()
_AUDIT = AuditStore()
_WEBHOOKS = WebhookStore()


@dataclass(frozen=True)
class KeyInfo:
    """A key as ``jobq keys list`` shows it (never the secret, nor its hash)."""

    id: int
    name: str
    role: str
    queues: tuple[str, ...] | None
    created_at: datetime
    revoked_at: datetime | None


def _principal(row: KeyPrincipal) -> Principal:
    return Principal(
        key_id=row.id,
        name=row.name,
        role=Role(row.role),
        queues=tuple(row.queues) if row.queues is not None else None,
    )


async def _notify(conn: Conn) -> None:
    await _KEYS.key_notify(conn, channel=CHANNEL)


async def _audit(
    conn: Conn,
    *,
    action: str,
    outcome: str,
    name: str,
    actor: str,
    before: str | None = None,
    after: str | None = None,
    detail: dict[str, Any] | None = None,
) -> None:
    await _AUDIT.audit_insert_key(
        conn,
        actor=actor,
        action=action,
        outcome=outcome,
        key_name=name,
        state_before=before,
        state_after=after,
        detail=detail,
    )


async def create_key(
    connection: Any,
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
    conn = Conn.of(connection)
    key_id = await _KEYS.key_next_id(conn)
    secret = new_secret(key_id)
    await _KEYS.key_insert(
        conn, key_id=key_id, name=name, role=role.value, queues=queues, digest=digest(secret)
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
    connection: Any,
    *,
    name: str,
    role: Role,
    queues: Sequence[str] | None,
    actor: str = INTERNAL_ACTOR,
) -> None:
    """Records an attempt to create a key under a taken name (it changed nothing)."""
    await _audit(
        Conn.of(connection),
        action="key.create",
        outcome="refused",
        name=name,
        actor=actor,
        detail=_key_detail(role, queues),
    )


async def list_keys(connection: Any) -> list[KeyInfo]:
    """Every key, revoked ones included, oldest first."""
    return [
        KeyInfo(
            id=r.id,
            name=r.name,
            role=r.role,
            queues=tuple(r.queues) if r.queues is not None else None,
            created_at=r.created_at,
            revoked_at=r.revoked_at,
        )
        for r in await _KEYS.key_list(Conn.of(connection))
    ]


async def revoke_key(connection: Any, *, name: str, actor: str = INTERNAL_ACTOR) -> bool:
    """Revokes a key by name; answers whether a live key of that name existed.

    Records the attempt, ``actor`` naming who made it: revoked, or refused (no live key).
    """
    conn = Conn.of(connection)
    revoked = await _KEYS.key_revoke(conn, name=name)
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


async def live_keys(connection: Any) -> tuple[dict[bytes, Principal], bool]:
    """The keys not revoked, by secret hash, and whether any key (revoked or not) exists."""
    conn = Conn.of(connection)
    live = {bytes(r.secret_sha256): _principal(r) for r in await _KEYS.key_live(conn)}
    any_key = bool(live) or await _KEYS.key_any(conn)
    return live, any_key


async def key_by_digest(connection: Any, secret_digest: bytes) -> Principal | None:
    """The live key with this secret hash, if any (for a key made after the cache was loaded)."""
    row = await _KEYS.key_by_digest(Conn.of(connection), digest=secret_digest)
    return _principal(row) if row is not None else None


async def any_keys(connection: Any) -> bool:
    """Whether any key was ever made (revoked ones count: revoking every key keeps auth on)."""
    return await _KEYS.key_any(Conn.of(connection))


async def webhook_secret(
    connection: Any,
    *,
    name: str,
    rotate: bool,
    grace_seconds: float,
    actor: str = INTERNAL_ACTOR,
) -> WebhookSecretRow | None:
    """A live key's webhook signing secret by name, first replaced by a new one when ``rotate``
    (the previous then signs too for ``grace_seconds``); ``None`` for no such live key."""
    conn = Conn.of(connection)
    if rotate:
        return await _WEBHOOKS.webhook_secret_rotate(
            conn,
            key_id=None,
            name=name,
            secret=new_webhook_secret(),
            grace_seconds=grace_seconds,
            actor=actor,
            actor_key_id=None,
        )
    return await _WEBHOOKS.webhook_secret_get(
        conn, key_id=None, name=name, grace_seconds=grace_seconds
    )
