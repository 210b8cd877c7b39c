"""Who is looking at the dashboard: the sign-in, the session cookie, CSRF tokens and flash messages.

**The session is the API key itself**, in a cookie ``jobq_session`` (``HttpOnly``,
``SameSite=Strict``, ``Path=/dashboard``, ``Secure`` when the request came over TLS, no expiry:
it ends with the browser session or on sign-out). Every dashboard request verifies it through
the very function the bearer auth of ``/v1`` uses (``app.api.auth.authenticate``): the
instance's key ring, a database lookup for a key the ring does not know yet, and the same
per-address failure limiter. Why the key and not a token standing for it:

- revocation is immediate and needs nothing new: a revoked key leaves every instance's ring
  within moments, so its session fails at the next request, on every instance;
- sessions are stateless: any instance behind a load balancer can check any cookie, with no
  session table, no shared memory and no server secret to distribute (jobq has none: a token
  mapping to a key id would need one to be unforgeable);
- a cookie is no weaker a home for the key than the ``Authorization`` header the API uses:
  scripts cannot read it (HttpOnly), other sites cannot make the browser send it (Strict),
  it never travels to ``/v1`` (Path), whose routes ignore cookies anyway, and it never travels
  in clear over a TLS deployment (Secure).

**CSRF.** Every action (a POST) must carry a token, in the form field ``csrf`` or the header
``X-CSRF-Token``: ``HMAC-SHA256(key=session value, msg="jobq-dashboard-csrf-v1")``, compared in
constant time. The key of that HMAC is the one secret every instance can recompute from the
request alone, which is what lets several instances share sessions without shared memory: the
session value is 256 bits of randomness that only the browser and the server know. A forging
page can neither read the cookie nor a page of ours (same-origin policy), so it cannot compute
or copy the token, and the token reveals nothing about the key. With authentication off
there is no key: the session value is then a random nonce in a cookie ``jobq_csrf`` (same
attributes) that the first page sets, double-submit style, so even an open dashboard is not
driveable from another site. The sign-in form is protected the same way.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
from dataclasses import dataclass

from starlette.requests import Request
from starlette.responses import Response

from app.api.auth import authenticate
from app.api.state import app_state
from app.auth.keys import NOBODY, Permission, Principal
from app.errors import DatabaseUnavailable, Unauthenticated

SESSION_COOKIE = "jobq_session"
NONCE_COOKIE = "jobq_csrf"
FLASH_COOKIE = "jobq_flash"
COOKIE_PATH = "/dashboard"
CSRF_FIELD = "csrf"
CSRF_HEADER = "x-csrf-token"
_CSRF_CONTEXT = b"jobq-dashboard-csrf-v1"
_NONCE_BYTES = 32
FLASH_SECONDS = 60
_FLASH_MAX_CHARS = 2000


class SignInNeeded(Exception):
    """The request has no valid session; ``clear`` when it presented one that no longer works."""

    def __init__(self, *, clear: bool) -> None:
        super().__init__("sign in")
        self.clear = clear


@dataclass(frozen=True)
class Visitor:
    """The dashboard's caller: their principal, their CSRF token, and a nonce cookie to set."""

    principal: Principal
    auth_on: bool
    csrf: str
    # A fresh nonce (authentication off, first visit): the response must set it as a cookie.
    new_nonce: str | None = None

    def may(self, permission: Permission) -> bool:
        """Whether the visitor's role grants the permission."""
        return self.principal.may(permission)

    @property
    def is_admin(self) -> bool:
        """Whether the visitor may act (cancel, retry, pause, resume, bulk)."""
        return self.principal.may(Permission.OPERATE)


def csrf_token(basis: str) -> str:
    """The CSRF token of a session (or nonce) value."""
    key = basis.encode("utf-8", "surrogatepass")
    return hmac.new(key, _CSRF_CONTEXT, hashlib.sha256).hexdigest()


def csrf_valid(basis: str | None, presented: str | None) -> bool:
    """Whether ``presented`` is the token of ``basis`` (constant-time comparison)."""
    if not basis or not presented:
        return False
    expected = csrf_token(basis).encode("ascii")
    return hmac.compare_digest(expected, presented.encode("utf-8", "surrogatepass"))


def _with_key(request: Request, secret: str) -> Request:
    """The same request, presenting ``secret`` as its bearer key (and no other credential)."""
    try:
        value = f"Bearer {secret}".encode("latin-1")
    except UnicodeEncodeError:
        value = b"Bearer"  # not a key of ours: refused (and counted) like any wrong key
    headers = [(k, v) for k, v in request.scope["headers"] if k != b"authorization"]
    headers.append((b"authorization", value))
    return Request({**request.scope, "headers": headers})


async def verify_key(request: Request, secret: str) -> Principal:
    """The live key with this secret, checked as the API checks a bearer key.

    Raises what the API's check raises: ``Unauthenticated`` (unknown, malformed or revoked),
    ``TooManyFailures`` (this address failed too often) or ``DatabaseUnavailable``.
    """
    return await authenticate(_with_key(request, secret))


def auth_enabled(request: Request) -> bool:
    """Whether the service requires keys (``False``: no key was ever made, the API is open)."""
    keys = app_state(request.app).running().keys
    if not keys.loaded.is_set():
        raise DatabaseUnavailable("the API keys could not be loaded yet; retry")
    return keys.enabled


async def visitor(request: Request) -> Visitor:
    """The caller of a dashboard request; ``SignInNeeded`` without a working session."""
    if not auth_enabled(request):
        nonce = request.cookies.get(NONCE_COOKIE)
        fresh = None
        if not nonce:
            nonce = fresh = secrets.token_urlsafe(_NONCE_BYTES)
        return Visitor(principal=NOBODY, auth_on=False, csrf=csrf_token(nonce), new_nonce=fresh)
    secret = request.cookies.get(SESSION_COOKIE)
    if not secret:
        raise SignInNeeded(clear=False)
    try:
        principal = await verify_key(request, secret)
    except Unauthenticated:
        raise SignInNeeded(clear=True) from None
    return Visitor(principal=principal, auth_on=True, csrf=csrf_token(secret))


def csrf_basis(request: Request, caller: Visitor) -> str | None:
    """The value a visitor's CSRF token is derived from: their session, or their nonce."""
    if caller.auth_on:
        return request.cookies.get(SESSION_COOKIE)
    return request.cookies.get(NONCE_COOKIE)


def pre_session(request: Request) -> tuple[str, str | None]:
    """The sign-in form's CSRF token, and a nonce to set when the browser has none yet."""
    nonce = request.cookies.get(NONCE_COOKIE)
    if nonce:
        return csrf_token(nonce), None
    fresh = secrets.token_urlsafe(_NONCE_BYTES)
    return csrf_token(fresh), fresh


def set_cookie(
    response: Response, request: Request, name: str, value: str, *, max_age: int | None = None
) -> None:
    """Sets one of the dashboard's cookies with the attributes every one of them has."""
    parts = [f"{name}={value}", f"Path={COOKIE_PATH}", "HttpOnly", "SameSite=Strict"]
    if max_age is not None:
        parts.append(f"Max-Age={max_age}")
    if request.url.scheme == "https":
        parts.append("Secure")
    response.headers.append("set-cookie", "; ".join(parts))


def clear_cookie(response: Response, request: Request, name: str) -> None:
    """Removes one of the dashboard's cookies from the browser."""
    parts = [f"{name}=", f"Path={COOKIE_PATH}", "HttpOnly", "SameSite=Strict", "Max-Age=0"]
    if request.url.scheme == "https":
        parts.append("Secure")
    response.headers.append("set-cookie", "; ".join(parts))


@dataclass(frozen=True)
class Flash:
    """A one-time message shown on the page an action redirects to."""

    kind: str  # "ok" or "error"
    text: str
    # A job the message is about, linked after it ("...: job 123"); an id, never a URL, so a
    # forged cookie can at most link to another job page of this dashboard.
    job_id: int | None = None


def set_flash(response: Response, request: Request, flash: Flash) -> None:
    """Leaves a message for the next page this browser opens."""
    data: dict[str, object] = {"k": flash.kind, "t": flash.text[:_FLASH_MAX_CHARS]}
    if flash.job_id is not None:
        data["j"] = flash.job_id
    raw = json.dumps(data).encode("utf-8")
    value = base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")
    set_cookie(response, request, FLASH_COOKIE, value, max_age=FLASH_SECONDS)


def take_flash(request: Request) -> Flash | None:
    """The message left for this page, if any (the caller clears the cookie)."""
    value = request.cookies.get(FLASH_COOKIE)
    if not value:
        return None
    try:
        data = json.loads(base64.urlsafe_b64decode(value + "=" * (-len(value) % 4)))
        kind, text = data["k"], data["t"]
    except (ValueError, TypeError, KeyError):
        return None
    if kind not in {"ok", "error"} or not isinstance(text, str):
        return None
    job_id = data.get("j")
    if type(job_id) is not int or job_id <= 0:  # bool is an int subclass: not an id
        job_id = None
    return Flash(kind=kind, text=text[:_FLASH_MAX_CHARS], job_id=job_id)
