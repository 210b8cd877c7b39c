"""What every dashboard page shares that needs no request: paths, limits, headers, static files.

The pages (``pages/``), the sign-in (``signin.py``) and the renderer (``board.py``) import from
here; nothing here imports them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

from fastapi import Request, Response
from fastapi.routing import APIRoute
from starlette.staticfiles import StaticFiles
from starlette.types import Scope

from app.domain.bounds import MAX_BIGINT
from app.domain.states import JobState
from app.errors import ERROR_TABLE, InvalidInput, JobqError, NotFound

PREFIX = "/dashboard"
LOGIN = f"{PREFIX}/login"
HERE = Path(__file__).parent
TEMPLATES = HERE / "templates"
STATIC = HERE / "static"

PAGE_SIZE = 50
FORM_MAX_FIELDS = 32
RETRY = {"Retry-After": "1"}

# Every state a page shows, retrying (scheduled after a failure's backoff) told apart.
STATES: tuple[str, ...] = tuple(s.value for s in JobState)

CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
}


class DashboardRoute(APIRoute):
    """A route whose every answer carries the dashboard's security headers and is never cached."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        """The route's handler, adding the headers to its response."""
        handler = super().get_route_handler()

        async def guarded(request: Request) -> Response:
            response = await handler(request)
            for name, value in SECURITY_HEADERS.items():
                response.headers.setdefault(name, value)
            response.headers.setdefault("Cache-Control", "no-store")
            return response

        return guarded


class DashboardStatic(StaticFiles):
    """The vendored static files: cached for a year when asked for by content version, else revalidated.

    Pages link ``/dashboard/static/<name>?v=<hash of the file>``, so a deploy that changes a
    file changes its URL and browsers never keep a stale one; the ETag covers other requests.
    """

    def __init__(self, directory: Path) -> None:
        super().__init__(directory=directory)
        self.versions = {
            path.name: hashlib.sha256(path.read_bytes()).hexdigest()[:16]
            for path in sorted(directory.iterdir())
            if path.is_file()
        }

    def file_response(
        self, full_path: Any, stat_result: Any, scope: Scope, status_code: int = 200
    ) -> Response:
        """The file, with caching headers for its version."""
        response = super().file_response(full_path, stat_result, scope, status_code)
        query = dict(parse_qsl(scope.get("query_string", b"").decode("latin-1")))
        name = Path(str(full_path)).name
        if query.get("v") and query.get("v") == self.versions.get(name):
            response.headers["Cache-Control"] = "public, max-age=31536000, immutable"
        else:
            response.headers["Cache-Control"] = "public, max-age=0, must-revalidate"
        response.headers["X-Content-Type-Options"] = "nosniff"
        return response


class Answer(Exception):
    """Stops a handler with this response (an error page, a redirect)."""

    def __init__(self, response: Response) -> None:
        super().__init__("answered")
        self.response = response


def is_htmx(request: Request) -> bool:
    """Whether the request comes from htmx (``HX-Request: true``)."""
    return request.headers.get("hx-request") == "true"


def safe_next(target: str | None) -> str | None:
    """A place inside the dashboard to return to after sign-in; anything else is ``None``."""
    if not target or "\\" in target or any(ord(c) < 32 for c in target):
        return None
    path = target.split("?", 1)[0]
    if path != PREFIX and not path.startswith(PREFIX + "/"):
        return None
    if path.startswith((LOGIN, f"{PREFIX}/fragments", f"{PREFIX}/static")) or "//" in target:
        return None
    return target


def job_id(text: str) -> int:
    """A job id from a path, or NotFound when it cannot be one."""
    if not text.isascii() or not text.isdigit() or not 1 <= int(text) <= MAX_BIGINT:
        raise NotFound(f"job {text[:40]!r} not found")
    return int(text)


def status_of(exc: JobqError) -> int:
    """The page's status for an error: the API's, except that unusable input is a 400 here."""
    if isinstance(exc, InvalidInput):
        return 400
    return ERROR_TABLE.get(type(exc), (400, "", ""))[0]


def input_problem(exc: InvalidInput) -> str:
    """What to tell a visitor about unusable input: a bad page position, or the service's words."""
    if any("after" in str(e.get("field", "")) for e in exc.errors):
        return "The page position (after) is malformed; start again from the newest jobs."
    return exc.detail
