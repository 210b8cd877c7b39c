"""Authentication and authorisation of every route: who calls (a key, or nobody when keys are off), and may they.

Each route declares what it needs as a dependency, ``Annotated[Principal, Allow(...)]``; the
strict JSON and lean hot routes (app/http/) call the same check, ``Allow.admit``, before reading
the body. The check costs no database round trip: keys come from the instance's key ring
(app/auth/keyring.py). Without a valid key the answer is 401 with ``WWW-Authenticate: Bearer``;
a key whose role lacks the permission, or whose queue scopes do not cover the queue named, gets
403. Secrets never reach a log line or a problem detail: problems name the key by its name only.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Annotated, Any

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from app.api.state import app_state
from app.auth.keys import NOBODY, Permission, Principal
from app.errors import DatabaseUnavailable, Forbidden, TooManyFailures, Unauthenticated

_BEARER = HTTPBearer(
    auto_error=False,
    scheme_name="apiKey",
    description="An API key made with `jobq keys create`, sent as `Authorization: Bearer <key>`.",
)

_RETRY = {"Retry-After": "1"}

logger = logging.getLogger("jobq.auth")

_DOING = {
    Permission.ENQUEUE: "enqueue jobs",
    Permission.WORK: "claim or hold leases",
    Permission.READ_JOBS: "read jobs",
    Permission.OBSERVE: "read queues, workers, metrics and the audit trail",
    Permission.OPERATE: "cancel or retry jobs, or create, delete, pause or resume queues",
}


def _bearer_token(request: Request) -> str | None:
    header = request.headers.get("authorization")
    if header is None:
        return None
    scheme, _, token = header.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        return ""  # presented, but not a bearer token: a failure like a wrong key
    return token


def _address(request: Request) -> str:
    # The peer address as the server sees it; a proxy in front should run one instance per
    # client network or filter by itself (X-Forwarded-For is not trusted).
    return request.client.host if request.client is not None else "unknown"


def _rejected(request: Request, reason: str, address: str | None = None) -> None:
    # Never the secret nor the header: a wrong key is often a right one pasted in the wrong place.
    client = address if address is not None else _address(request)
    logger.warning(
        "authentication rejected (%s) from %s",
        reason,
        client,
        extra={"event": "auth.rejected", "key": "unknown", "client": client, "reason": reason},
    )


async def authenticate(request: Request) -> Principal:
    """The caller's key, or :data:`NOBODY` while authentication is off; 401 / 429 otherwise."""
    runtime = app_state(request.app).running()
    keys = runtime.keys
    if not keys.loaded.is_set():
        # Not knowing the keys is not the same as having none: refuse rather than open up.
        raise DatabaseUnavailable("the API keys could not be loaded yet; retry", headers=_RETRY)
    if not keys.enabled:
        return NOBODY
    token = _bearer_token(request)
    if token is None:
        _rejected(request, "no_key")
        raise Unauthenticated(
            "this request needs an API key: send Authorization: Bearer <key>",
            headers={"WWW-Authenticate": 'Bearer realm="jobq"'},
        )
    principal = keys.known(token) if token else None
    if principal is not None:
        return principal  # the hot path: a dictionary lookup, nothing counted
    address = _address(request)
    wait = runtime.failures.retry_after(address)
    if wait is not None:
        _rejected(request, "too_many_failures", address)
        raise TooManyFailures(
            f"too many failed authentications from this address; retry in {wait} s",
            headers={"Retry-After": str(wait)},
        )
    if token:
        principal = await keys.authenticate(token)  # a key made a moment ago
    if principal is None:
        runtime.failures.failed(address)
        _rejected(request, "invalid_key" if token else "not_bearer", address)
        raise Unauthenticated(
            "the API key is not valid (unknown, malformed or revoked)",
            headers={"WWW-Authenticate": 'Bearer realm="jobq", error="invalid_token"'},
        )
    return principal


def check(principal: Principal, permission: Permission) -> Principal:
    """403 unless the principal's role grants the permission."""
    if not principal.may(permission):
        raise Forbidden(
            f"key {principal.name!r} has role {principal.role.value}, which may not "
            f"{_DOING[permission]}"
        )
    return principal


async def authorize(request: Request, permission: Permission) -> Principal:
    """The caller, if it may do what the route does."""
    return check(await authenticate(request), permission)


class Allow:
    """The dependency of a route that needs ``permission``; answers the caller's principal."""

    def __init__(self, permission: Permission) -> None:
        self.permission = permission

    async def admit(self, request: Request) -> Principal:
        """The caller, if it may do what the route does (a :class:`~app.http.strict_json.Gate`)."""
        return await authorize(request, self.permission)

    async def __call__(
        self,
        request: Request,
        # Declared so OpenAPI documents the scheme; the check reads the header itself.
        _credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_BEARER)],
    ) -> Principal:
        return await authorize(request, self.permission)


def requires(permission: Permission) -> Any:
    """``Annotated`` metadata for a route parameter: ``Annotated[Principal, requires(...)]``."""
    return Depends(Allow(permission))


def allow_queue(principal: Principal, queue: str, *, field: str) -> None:
    """403 naming ``field`` unless the key's scopes cover ``queue``."""
    if not principal.covers(queue):
        raise Forbidden(
            f"key {principal.name!r} is not scoped to queue {queue!r}",
            errors=[{"field": field, "message": "queue outside the key's scopes"}],
        )


def allow_queues(principal: Principal, queues: Iterable[str], *, field: str) -> None:
    """403 naming the first queue (``field[i]``) the key's scopes do not cover."""
    if not principal.scoped:
        return
    for index, queue in enumerate(queues):
        allow_queue(principal, queue, field=f"{field}[{index}]")
