"""Sign-in and sign-out (``/dashboard/login``, ``/dashboard/logout``), and the 404 for other paths.

These run before there is a session, so they take the bare request, not a
:class:`~app.dashboard.board.Call`; the session cookie itself is ``session.py``'s.
"""

from __future__ import annotations

from collections.abc import Mapping

from fastapi import Request, Response
from fastapi.responses import RedirectResponse

from app.auth.keys import Permission
from app.dashboard.base import LOGIN, PREFIX, RETRY, Answer, safe_next
from app.dashboard.board import Board
from app.dashboard.session import (
    CSRF_FIELD,
    CSRF_HEADER,
    NONCE_COOKIE,
    SESSION_COOKIE,
    SignInNeeded,
    Visitor,
    auth_enabled,
    clear_cookie,
    csrf_basis,
    csrf_valid,
    pre_session,
    set_cookie,
    verify_key,
    visitor,
)
from app.errors import DatabaseUnavailable, JobqError, TooManyFailures, Unauthenticated


class SignIn:
    """The sign-in form and its answers, drawn by one app's :class:`Board`."""

    def __init__(self, board: Board) -> None:
        self.board = board

    def login_form(
        self,
        request: Request,
        *,
        status: int = 200,
        error: str | None = None,
        next_target: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Response:
        """The sign-in form (with its CSRF token), and an error when the last try failed."""
        token, fresh = pre_session(request)
        response = self.board.render(
            request,
            "login.html",
            caller=None,
            status=status,
            error=error,
            csrf=token,
            next=next_target or "",
        )
        if fresh is not None:
            set_cookie(response, request, NONCE_COOKIE, fresh)
        for name, value in (headers or {}).items():
            response.headers[name] = value
        return response

    async def login_page(self, request: Request) -> Response:
        """``GET /dashboard/login``: the form, or the overview when no sign-in is needed."""
        try:
            enabled = auth_enabled(request)
        except DatabaseUnavailable as exc:
            return self.board.error(request, 503, exc.detail, headers=RETRY)
        next_target = safe_next(request.query_params.get("next"))
        if not enabled:
            return RedirectResponse(next_target or PREFIX, status_code=303)
        return self.login_form(request, next_target=next_target)

    async def login(self, request: Request) -> Response:
        """``POST /dashboard/login``: checks the key as the API would and starts the session."""
        try:
            enabled = auth_enabled(request)
            fields = await self.board.form(request)
        except DatabaseUnavailable as exc:
            return self.board.error(request, 503, exc.detail, headers=RETRY)
        except Answer as answer:
            return answer.response
        next_target = safe_next(fields.get("next"))
        if not enabled:
            return RedirectResponse(next_target or PREFIX, status_code=303)

        def refused(status: int, error: str, headers: Mapping[str, str] | None = None) -> Response:
            return self.login_form(
                request, status=status, error=error, next_target=next_target, headers=headers
            )

        if not csrf_valid(request.cookies.get(NONCE_COOKIE), fields.get(CSRF_FIELD)):
            return refused(403, "The sign-in form expired; please try again.")
        secret = fields.get("key", "").strip()
        if not secret:
            return refused(400, "Paste an API key (a viewer or admin key from `jobq keys create`).")
        try:
            principal = await verify_key(request, secret)
        except Unauthenticated:
            return refused(401, "That key is not valid: unknown, mistyped or revoked.")
        except TooManyFailures as exc:
            return refused(
                429, f"Too many failed sign-ins from this address. {exc.detail}.", exc.headers
            )
        except DatabaseUnavailable as exc:
            return refused(503, exc.detail)
        if not principal.may(Permission.OBSERVE):
            return refused(
                403,
                f"Key {principal.name!r} has role {principal.role.value}: the dashboard needs a "
                "viewer or admin key.",
            )
        response = RedirectResponse(next_target or PREFIX, status_code=303)
        set_cookie(response, request, SESSION_COOKIE, secret)
        clear_cookie(response, request, NONCE_COOKIE)
        return response

    async def logout(self, request: Request) -> Response:
        """``POST /dashboard/logout``: ends the session (with its CSRF token) and shows the form."""
        try:
            caller = await visitor(request)
            fields = await self.board.form(request)
        except SignInNeeded as exc:
            return self.board.sign_in(request, clear=exc.clear)
        except (TooManyFailures, DatabaseUnavailable) as exc:
            response: Response = RedirectResponse(LOGIN, status_code=303)
            clear_cookie(response, request, SESSION_COOKIE)
            del exc
            return response
        except Answer as answer:
            return answer.response
        if not caller.auth_on:
            return RedirectResponse(PREFIX, status_code=303)
        presented = fields.get(CSRF_FIELD) or request.headers.get(CSRF_HEADER)
        if not csrf_valid(csrf_basis(request, caller), presented):
            return self.board.error(
                request, 403, "The form's security token is missing or wrong.", caller=caller
            )
        response = RedirectResponse(LOGIN, status_code=303)
        clear_cookie(response, request, SESSION_COOKIE)
        return response

    async def not_found(self, request: Request) -> Response:
        """Any other path under ``/dashboard``."""
        if request.path_params.get("rest", "") == "":
            return RedirectResponse(PREFIX, status_code=307)
        caller: Visitor | None
        try:
            caller = await visitor(request)
        except (SignInNeeded, JobqError):
            caller = None
        return self.board.error(request, 404, "There is no such dashboard page.", caller=caller)
