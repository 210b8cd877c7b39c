"""KeyStore: the statements of ``sql/keys.sql`` (API keys), one method each."""

from __future__ import annotations

from collections.abc import Sequence

from app.domain.records import KeyPrincipal, KeyRow, LiveKey
from app.store.conn import Conn


class KeyStore:
    """Runs the api_keys table's statements; callers own the transaction."""

    async def key_next_id(self, conn: Conn) -> int:
        """Reserves the next key id."""
        [row] = await conn.fetch("key_next_id")
        return int(row["id"])

    async def key_insert(
        self,
        conn: Conn,
        *,
        key_id: int,
        name: str,
        role: str,
        queues: Sequence[str] | None,
        digest: bytes,
    ) -> None:
        """Stores a new key under a reserved id; a taken name raises the unique violation."""
        await conn.fetch(
            "key_insert",
            {
                "id": key_id,
                "name": name,
                "role": role,
                "queues": list(queues) if queues is not None else None,
                "digest": digest,
            },
        )

    async def key_revoke(self, conn: Conn, *, name: str) -> bool:
        """Revokes the live key of a name; answers whether there was one."""
        return bool(await conn.fetch("key_revoke", {"name": name}))

    async def key_list(self, conn: Conn) -> list[KeyRow]:
        """Every key, revoked ones included, oldest first."""
        return [KeyRow.from_row(row) for row in await conn.fetch("key_list")]

    async def key_live(self, conn: Conn) -> list[LiveKey]:
        """The keys not revoked, with their secrets' hashes."""
        return [LiveKey.from_row(row) for row in await conn.fetch("key_live")]

    async def key_by_digest(self, conn: Conn, *, digest: bytes) -> KeyPrincipal | None:
        """The live key whose secret has this hash, or ``None``."""
        rows = await conn.fetch("key_by_digest", {"digest": digest})
        return KeyPrincipal.from_row(rows[0]) if rows else None

    async def key_any(self, conn: Conn) -> bool:
        """Whether any key was ever made (revoked ones count)."""
        [row] = await conn.fetch("key_any")
        return bool(row["any_key"])

    async def key_notify(self, conn: Conn, *, channel: str) -> None:
        """Tells every instance to reload its key cache when the transaction commits."""
        await conn.fetch("key_notify", {"channel": channel})
