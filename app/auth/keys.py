"""API keys: the secret's format and hash, the roles and what each may do, queue scopes.

A secret is ``jobq_<id>_<43 random URL-safe characters>`` (256 bits of randomness): the prefix
makes a leaked key easy to recognise in a scan, the id says which key it is without revealing
anything. The database keeps only its SHA-256; with that much randomness a plain hash is enough
(no salt or slow hash is needed against guessing).
"""

from __future__ import annotations

import enum
import fnmatch
import hashlib
import re
import secrets
from collections.abc import Sequence
from dataclasses import dataclass

KEY_PREFIX = "jobq_"
_SECRET_BYTES = 32
_SECRET = re.compile(r"^jobq_([1-9][0-9]{0,17})_[A-Za-z0-9_-]{43}$")

# A scope is a queue name, or a pattern of queue-name characters where ``*`` stands for any run.
SCOPE_PATTERN = re.compile(r"^[A-Za-z0-9_.:*-]{1,128}$")
KEY_NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}$")


class Role(enum.StrEnum):
    """What a key is for."""

    PRODUCER = "producer"
    WORKER = "worker"
    VIEWER = "viewer"
    ADMIN = "admin"


class Permission(enum.StrEnum):
    """What a route needs; each route names one (``app/api/auth.py`` holds the table)."""

    ENQUEUE = "enqueue"  # POST /v1/jobs, /v1/jobs/batch
    WORK = "work"  # claim, heartbeat, complete, fail, release
    READ_JOBS = "read_jobs"  # GET /v1/jobs, /v1/jobs/{id}
    OBSERVE = "observe"  # GET /v1/queues, /v1/workers, /metrics
    OPERATE = "operate"  # cancel, retry; create, delete, pause, resume queues


GRANTS: dict[Role, frozenset[Permission]] = {
    Role.PRODUCER: frozenset({Permission.ENQUEUE, Permission.READ_JOBS}),
    Role.WORKER: frozenset({Permission.WORK, Permission.READ_JOBS}),
    Role.VIEWER: frozenset({Permission.READ_JOBS, Permission.OBSERVE}),
    Role.ADMIN: frozenset(Permission),
}


def new_secret(key_id: int) -> str:
    """A fresh secret for the key with this id."""
    return f"{KEY_PREFIX}{key_id}_{secrets.token_urlsafe(_SECRET_BYTES)}"


def well_formed(secret: str) -> bool:
    """Whether a presented secret has the shape of one (anything else is refused unlooked-up)."""
    return _SECRET.match(secret) is not None


def digest(secret: str) -> bytes:
    """The SHA-256 of a secret: what the database stores and the cache is keyed by."""
    return hashlib.sha256(secret.encode("utf-8", "surrogatepass")).digest()


def scope_error(patterns: Sequence[str]) -> str | None:
    """Why a list of queue scopes is unusable, or ``None``."""
    if not patterns:
        return "name at least one queue or pattern"
    for pattern in patterns:
        if not SCOPE_PATTERN.match(pattern):
            return (
                f"scope {pattern!r}: use queue-name characters (letters, digits, _ . : -) "
                "and * for any run of them"
            )
    return None


def like_pattern(scope: str) -> str:
    """The scope as a SQL LIKE pattern (``*`` becomes ``%``; ``_`` and ``\\`` are escaped)."""
    return scope.replace("\\", "\\\\").replace("_", "\\_").replace("%", "\\%").replace("*", "%")


@dataclass(frozen=True)
class Principal:
    """The caller of a request: a key (its id, name, role and scopes), or nobody when keys are off."""

    key_id: int | None
    name: str
    role: Role
    # Queue names or patterns the key is limited to; ``None``: every queue.
    queues: tuple[str, ...] | None = None

    def may(self, permission: Permission) -> bool:
        """Whether the role grants this permission."""
        return permission in GRANTS[self.role]

    def covers(self, queue: str) -> bool:
        """Whether the key's scopes include this queue."""
        if self.queues is None:
            return True
        return any(fnmatch.fnmatchcase(queue, pattern) for pattern in self.queues)

    @property
    def scoped(self) -> bool:
        """Whether the key is limited to some queues."""
        return self.queues is not None

    def like_patterns(self) -> list[str] | None:
        """The scopes as SQL LIKE patterns, for listings filtered in the database."""
        return None if self.queues is None else [like_pattern(q) for q in self.queues]


# Authentication off (no key was ever made; loopback only): every request may do everything.
NOBODY = Principal(key_id=None, name="anonymous", role=Role.ADMIN)
