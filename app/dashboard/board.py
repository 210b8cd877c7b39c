"""The dashboard's renderer and guard: templates, error pages, redirects, forms, and the checks
every page passes (session, permissions, CSRF) before its handler runs with a :class:`Call`.

Each page module (``pages/``) declares its :class:`Route` values; ``router.py`` hands them to
:meth:`Board.run`, which answers errors the way every page does: a page with the error and its
status, never a 500 for unusable input.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode, urlsplit

from fastapi import Request, Response
from fastapi.responses import HTMLResponse, RedirectResponse
from jinja2 import Environment, FileSystemLoader, StrictUndefined, select_autoescape

from app.api.state import app_state
from app.auth.keys import Permission
from app.dashboard import views
from app.dashboard.base import (
    FORM_MAX_FIELDS,
    LOGIN,
    PREFIX,
    RETRY,
    STATES,
    STATIC,
    TEMPLATES,
    Answer,
    DashboardStatic,
    is_htmx,
    safe_next,
    status_of,
)
from app.dashboard.session import (
    CSRF_FIELD,
    CSRF_HEADER,
    FLASH_COOKIE,
    NONCE_COOKIE,
    SESSION_COOKIE,
    Flash,
    SignInNeeded,
    Visitor,
    clear_cookie,
    csrf_basis,
    csrf_valid,
    set_cookie,
    set_flash,
    take_flash,
    visitor,
)
from app.errors import (
    DatabaseUnavailable,
    JobqError,
    TooManyFailures,
    UnusableValue,
    values_refused,
)
from app.queue.services import Services
from app.settings import Settings


@dataclass(frozen=True)
class Call:
    """One dashboard request as a handler sees it: the request, the visitor, the form fields."""

    request: Request
    caller: Visitor
    board: Board
    form: Mapping[str, str] = field(default_factory=dict)

    @property
    def services(self) -> Services:
        """The app's services."""
        return app_state(self.request.app).running().services

    @property
    def settings(self) -> Settings:
        """The app's settings."""
        return self.board.settings

    @property
    def fragment(self) -> bool:
        """Whether htmx asked (only the refreshable part is answered)."""
        return is_htmx(self.request)

    def page(self, name: str, *, nav: str, status: int = 200, **context: Any) -> HTMLResponse:
        """The page ``<name>.html``, or its fragment when htmx asked, for this visitor."""
        template = f"fragments/{name}.html" if self.fragment else f"{name}.html"
        return self.render(template, nav=nav, status=status, **context)

    def render(self, template: str, *, nav: str, status: int = 200, **context: Any) -> HTMLResponse:
        """A template for this visitor."""
        return self.board.render(
            self.request, template, caller=self.caller, status=status, nav=nav, **context
        )

    def refuse(self, status: int, message: str) -> Answer:
        """An error page for this visitor, to raise and stop the handler with."""
        return Answer(self.board.error(self.request, status, message, caller=self.caller))

    def redirect(self, target: str, flash: Flash | None = None) -> Response:
        """A 303 to ``target``, leaving a flash message for it."""
        return self.board.redirect(self.request, target, flash)


Handler = Callable[[Call], Awaitable[Response]]


@dataclass(frozen=True)
class Route:
    """One page's (or action's) route: what it needs, and whether it changes something (CSRF)."""

    method: str
    path: str
    handler: Handler
    needs: tuple[Permission, ...]
    action: bool = False


OBSERVE = (Permission.OBSERVE,)
READ = (Permission.OBSERVE, Permission.READ_JOBS)
OPERATE = (Permission.OBSERVE, Permission.OPERATE)
READ_OPERATE = (Permission.OBSERVE, Permission.READ_JOBS, Permission.OPERATE)


class Board:
    """Renders the dashboard's pages for one app's settings and guards their handlers."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.static = DashboardStatic(STATIC)
        self.env = Environment(
            loader=FileSystemLoader(TEMPLATES),
            autoescape=select_autoescape(default=True, default_for_string=True),
            undefined=StrictUndefined,
            auto_reload=False,  # templates ship with the package and never change while serving
            trim_blocks=True,
            lstrip_blocks=True,
        )
        self.env.globals.update(
            static=self.static_url,
            refresh_seconds=settings.dashboard_refresh_seconds,
            states=STATES,
            prefix=PREFIX,
        )
        self.env.filters.update(
            age=views.human_seconds,
            dur=views.duration,
            share=views.share,
            iso=views.iso,
            utc=views.utc,
            pretty=views.pretty_json,
            short_json=views.short_json,
            cut=views.cut,
            exception_line=views.exception_line,
            rel=views.relative,
            q=lambda value: quote(str(value), safe=""),
        )

    def static_url(self, name: str) -> str:
        """The versioned URL of a static file."""
        version = self.static.versions.get(name, "")
        return f"{PREFIX}/static/{name}?v={version}"

    def render(
        self,
        request: Request,
        template: str,
        *,
        caller: Visitor | None,
        status: int = 200,
        nav: str = "",
        **context: Any,
    ) -> HTMLResponse:
        """A page (or fragment) from its template; a flash left for it is shown once."""
        flash = None if is_htmx(request) else take_flash(request)
        body = self.env.get_template(template).render(
            visitor=caller,
            nav=nav,
            flash=flash,
            now=datetime.now(UTC),
            **context,
        )
        response = HTMLResponse(body, status_code=status)
        if flash is not None:
            clear_cookie(response, request, FLASH_COOKIE)
        return response

    def error(
        self,
        request: Request,
        status: int,
        message: str,
        *,
        caller: Visitor | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> HTMLResponse:
        """An error page (a bare message for htmx) with this status."""
        template = "fragments/error.html" if is_htmx(request) else "error.html"
        response = self.render(
            request, template, caller=caller, status=status, status_code=status, message=message
        )
        response.headers.update(headers or {})
        return response

    def sign_in(self, request: Request, *, clear: bool) -> Response:
        """Where a request without a working session goes: the sign-in form."""
        if is_htmx(request):
            current = urlsplit(request.headers.get("hx-current-url", ""))
            back = safe_next(current.path + (f"?{current.query}" if current.query else ""))
            target = f"{LOGIN}?{urlencode({'next': back})}" if back else LOGIN
            response: Response = self.error(
                request,
                401,
                "Your session has ended; sign in again.",
                headers={"HX-Redirect": target},
            )
        else:
            back = safe_next(
                request.url.path + (f"?{request.url.query}" if request.url.query else "")
            )
            if request.method != "GET":
                back = None
            target = f"{LOGIN}?{urlencode({'next': back})}" if back else LOGIN
            response = RedirectResponse(target, status_code=303)
        if clear:
            clear_cookie(response, request, SESSION_COOKIE)
        return response

    def redirect(self, request: Request, target: str, flash: Flash | None = None) -> Response:
        """A 303 to ``target`` (inside the dashboard), leaving a flash message for it."""
        response = RedirectResponse(target, status_code=303)
        if flash is not None:
            set_flash(response, request, flash)
        return response

    async def form(self, request: Request) -> dict[str, str]:
        """The fields of an urlencoded form body (the first value of each)."""
        body = await request.body()
        kind = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
        if body and kind != "application/x-www-form-urlencoded":
            raise Answer(self.error(request, 415, "Send the dashboard's own forms."))
        try:
            pairs = parse_qsl(
                body.decode("utf-8", "replace"),
                keep_blank_values=True,
                max_num_fields=FORM_MAX_FIELDS,
            )
        except ValueError:
            raise Answer(self.error(request, 400, "Too many form fields.")) from None
        fields: dict[str, str] = {}
        for name, value in pairs:
            fields.setdefault(name, value)
        return fields

    async def run(
        self,
        request: Request,
        handler: Handler,
        permissions: Sequence[Permission],
        *,
        action: bool = False,
    ) -> Response:
        """Checks the session, permissions and (for an action) the CSRF token, then runs ``handler``."""
        try:
            caller = await visitor(request)
        except SignInNeeded as exc:
            return self.sign_in(request, clear=exc.clear)
        except TooManyFailures as exc:
            return self.error(request, 429, exc.detail, headers=exc.headers)
        except DatabaseUnavailable as exc:
            return self.error(request, 503, exc.detail, headers=RETRY)
        for permission in permissions:
            if not caller.may(permission):
                needs = (
                    "act on jobs and queues: that needs an admin key"
                    if permission == Permission.OPERATE
                    else "see this page: that needs a viewer or admin key"
                )
                return self.error(
                    request,
                    403,
                    f"Key {caller.principal.name!r} has role {caller.principal.role.value}, "
                    f"which may not {needs}.",
                    caller=caller,
                )
        try:
            form: dict[str, str] = {}
            if action:
                form = await self.form(request)
                presented = form.get(CSRF_FIELD) or request.headers.get(CSRF_HEADER)
                if not csrf_valid(csrf_basis(request, caller), presented):
                    return self.error(
                        request,
                        403,
                        "The form's security token is missing or wrong; nothing was changed. "
                        "Reload the page and try again.",
                        caller=caller,
                    )
            with values_refused():
                response = await handler(
                    Call(request=request, caller=caller, board=self, form=form)
                )
        except Answer as answer:
            response = answer.response
        except UnusableValue:
            response = self.error(
                request, 400, "A value is out of range or malformed.", caller=caller
            )
        except JobqError as exc:
            response = self.error(request, status_of(exc), exc.detail, caller=caller)
        if caller.new_nonce is not None:
            set_cookie(response, request, NONCE_COOKIE, caller.new_nonce)
        return response
