"""The dashboard's routes: pages, their htmx fragments, the actions, sign-in, and the static files.

Every page is a full HTML page and has a fragment (``/dashboard/fragments/...``) holding its
refreshable part, which the page polls every few seconds while its tab is visible
(``static/dashboard.js``). Data comes from the services (:class:`~app.queue.services.Services`)
methods only, the same ones the API routes call, so a refresh costs what an API read costs:
counts come from the maintained counters (``queue_stats``), never from a ``COUNT(*)``; the
number a bulk action would touch is asked for only on its confirmation step.

Access: pages need OBSERVE (job pages also READ_JOBS), actions need OPERATE and a CSRF token
(``session.py``). Without a session a page redirects (303) to the sign-in form and a fragment
answers 401 with ``HX-Redirect``. A key scoped to some queues sees and acts on those only.
Every answer is HTML escaped by Jinja's autoescape, carries a strict Content-Security-Policy
(scripts and styles from this origin only, no inline script, no eval), and no request answers
500: unknown ids are a 404 page, unusable filters the page with an inline error (400).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode, urlsplit

import asyncpg
from fastapi import APIRouter, Request, Response
from fastapi.responses import HTMLResponse, RedirectResponse
from fastapi.routing import APIRoute
from jinja2 import Environment, FileSystemLoader, StrictUndefined, select_autoescape
from sqlalchemy.exc import DBAPIError
from starlette.routing import Mount
from starlette.staticfiles import StaticFiles
from starlette.types import Scope

from app.api.schemas import AuditAction, payload_filter
from app.api.state import app_state
from app.auth.keys import Permission, like_pattern
from app.dashboard import views
from app.dashboard.session import (
    CSRF_FIELD,
    CSRF_HEADER,
    FLASH_COOKIE,
    NONCE_COOKIE,
    SESSION_COOKIE,
    Flash,
    SignInNeeded,
    Visitor,
    auth_enabled,
    clear_cookie,
    csrf_basis,
    csrf_valid,
    pre_session,
    set_cookie,
    set_flash,
    take_flash,
    verify_key,
    visitor,
)
from app.domain.cron import SCHEDULE_NAME_PATTERN
from app.errors import (
    ERROR_TABLE,
    DatabaseUnavailable,
    Forbidden,
    InvalidInput,
    InvalidTransition,
    JobqError,
    NotFound,
    TooManyFailures,
    Unauthenticated,
    sqlstate,
)
from app.queue.bounds import MAX_BIGINT, instant_in_window
from app.queue.services import Services
from app.queue.states import BULK_STATES, BulkAction, JobStatus, bulk_states
from app.queue.types import JobSearch
from app.settings import Settings

PREFIX = "/dashboard"
LOGIN = f"{PREFIX}/login"
HERE = Path(__file__).parent
TEMPLATES = HERE / "templates"
STATIC = HERE / "static"

PAGE_SIZE = 50
THROUGHPUT_MINUTES = 60
CURSOR_MAX_CHARS = 200
ACTOR_MAX_CHARS = 255
# Job links shown per worker; the rest are counted.
WORKER_JOB_LINKS = 20
FORM_MAX_FIELDS = 32

_RETRY = {"Retry-After": "1"}

STATES: tuple[str, ...] = tuple(s.value for s in JobStatus)
# Actions the jobs page offers on a whole filter (the service also knows delete).
BULK_OFFERED: tuple[BulkAction, ...] = (BulkAction.RETRY, BulkAction.CANCEL)
_BULK_DONE = {BulkAction.RETRY: "Retried", BulkAction.CANCEL: "Cancelled"}
_ACTION_PATTERN = re.compile(r"^[a-z][a-z0-9_.]{0,63}$")

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


class _Answer(Exception):
    """Stops a handler with this response (an error page, a redirect)."""

    def __init__(self, response: Response) -> None:
        super().__init__("answered")
        self.response = response


@dataclass(frozen=True)
class Call:
    """One dashboard request as a handler sees it: the request, the visitor, the form fields."""

    request: Request
    caller: Visitor
    form: Mapping[str, str] = field(default_factory=dict)

    @property
    def services(self) -> Services:
        """The app's services."""
        return app_state(self.request.app).running().services

    @property
    def fragment(self) -> bool:
        """Whether htmx asked (only the refreshable part is answered)."""
        return is_htmx(self.request)


Handler = Callable[[Call], Awaitable[Response]]


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


# -- filters ------------------------------------------------------------------------------


@dataclass(frozen=True)
class JobFilters:
    """The jobs page's filters as typed, and as the service takes them."""

    queue: str | None = None
    state: JobStatus | None = None
    type: str | None = None
    payload_text: str = ""
    payload: Any = None
    created_after: datetime | None = None
    created_before: datetime | None = None
    after: str | None = None

    def params(self, *, after: str | None = None) -> dict[str, str]:
        """The filters as query parameters (empty ones left out), with a keyset position."""
        out: dict[str, str] = {}
        if self.queue:
            out["queue"] = self.queue
        if self.state:
            out["state"] = self.state.value
        if self.type:
            out["type"] = self.type
        if self.payload_text:
            out["payload"] = self.payload_text
        if self.created_after:
            out["created_after"] = _form_time(self.created_after)
        if self.created_before:
            out["created_before"] = _form_time(self.created_before)
        if after:
            out["after"] = after
        return out

    def query(self, *, after: str | None = None) -> str:
        """The filters as a query string (``""`` when there are none)."""
        return urlencode(self.params(after=after))

    def url(self, *, after: str | None = None, path: str = f"{PREFIX}/jobs") -> str:
        """The jobs page (or ``path``) with these filters and keyset position."""
        query = self.query(after=after)
        return f"{path}?{query}" if query else path

    @property
    def described(self) -> str:
        """The filters in words, for the bulk confirmation."""
        parts = []
        if self.queue:
            parts.append(f"queue = {self.queue}")
        if self.state:
            parts.append(f"state = {self.state.value}")
        if self.type:
            parts.append(f"type = {self.type}")
        if self.payload_text:
            parts.append(f"payload contains {self.payload_text}")
        if self.created_after:
            parts.append(f"created from {_form_time(self.created_after)} UTC")
        if self.created_before:
            parts.append(f"created before {_form_time(self.created_before)} UTC")
        return ", ".join(parts) if parts else "no filter: every queue you can see"


def _form_time(value: datetime) -> str:
    """An instant as a datetime-local field shows it, in UTC (the dashboard's clock)."""
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M")


def parse_form_time(text: str, label: str) -> tuple[datetime | None, str | None]:
    """A datetime-local field's value, read in UTC, or why it is unusable."""
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        return None, f"The {label} time is not a date and time such as 2030-01-31T09:00."
    value = value.replace(tzinfo=UTC) if value.tzinfo is None else value
    try:
        instant_in_window(value)
    except ValueError as exc:
        return None, f"The {label} time is out of range: {exc}."
    return value, None


def parse_payload_filter(text: str) -> tuple[Any, str | None]:
    """The JSON typed as a payload filter, parsed as the API parses it, or why it is unusable."""
    try:
        value = payload_filter(text)
    except InvalidInput as exc:
        detail = exc.detail.removeprefix("payload filter: ")
        return None, (
            f'The payload filter is not usable: {detail}. Type JSON such as {{"user": 42}}.'
        )
    if not isinstance(value, dict | list):
        return None, (
            'The payload filter must be a JSON object or array, such as {"user": 42}; '
            "leave it empty to match every payload."
        )
    return value, None


def parse_filters(params: Mapping[str, str], settings: Settings) -> tuple[JobFilters, list[str]]:
    """The jobs page's filters from query or form fields, and every problem with them."""
    errors: list[str] = []
    queue = (params.get("queue") or "").strip() or None
    queue_max = settings.queue_name_max_chars
    if queue is not None and not re.fullmatch(
        rf"[A-Za-z0-9][A-Za-z0-9_.:-]{{0,{queue_max - 1}}}", queue
    ):
        errors.append(
            f"A queue name is a letter or digit, then up to {queue_max - 1} letters, digits "
            "or _ . : - characters."
        )
    state_text = (params.get("state") or "").strip()
    state: JobStatus | None = None
    if state_text:
        try:
            state = JobStatus(state_text)
        except ValueError:
            errors.append(f"Unknown state {state_text!r}: choose one of {', '.join(STATES)}.")
    job_type = params.get("type") or None
    if job_type is not None and (len(job_type) > settings.type_max_chars or "\x00" in job_type):
        errors.append(f"A job type is at most {settings.type_max_chars} characters, without NUL.")
    payload_text = (params.get("payload") or "").strip()
    payload: Any = None
    if payload_text:
        payload, problem = parse_payload_filter(payload_text)
        if problem is not None:
            errors.append(problem)
    times: dict[str, datetime | None] = {}
    for name, label in (("created_after", "from"), ("created_before", "before")):
        text = (params.get(name) or "").strip()
        times[name] = None
        if text:
            times[name], problem = parse_form_time(text, label)
            if problem is not None:
                errors.append(problem)
    after = params.get("after") or None
    if after is not None and (len(after) > CURSOR_MAX_CHARS or not after.isascii()):
        errors.append("The page position (after) is malformed; start again from the newest jobs.")
        after = None
    filters = JobFilters(
        queue=queue,
        state=state,
        type=job_type,
        payload_text=payload_text,
        payload=payload,
        created_after=times["created_after"],
        created_before=times["created_before"],
        after=after,
    )
    return filters, errors


def bulk_offered(state: JobStatus | None) -> list[str]:
    """The bulk actions that make sense for a state filter (each takes some state of it)."""
    offered = []
    for action in BULK_OFFERED:
        allowed, default = BULK_STATES[action]
        if (state is None and default) or (state is not None and state in allowed):
            offered.append(action.value)
    return offered


# -- the router ---------------------------------------------------------------------------


class Dashboard:
    """Renders the dashboard's pages for one app's settings."""

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
            iso=views.iso,
            utc=views.utc,
            pretty=views.pretty_json,
            short_json=views.short_json,
            cut=views.cut,
            rel=views.relative,
            q=lambda value: quote(str(value), safe=""),
        )

    def static_url(self, name: str) -> str:
        """The versioned URL of a static file."""
        version = self.static.versions.get(name, "")
        return f"{PREFIX}/static/{name}?v={version}"

    # -- answering --------------------------------------------------------------------------

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
            raise _Answer(self.error(request, 415, "Send the dashboard's own forms."))
        try:
            pairs = parse_qsl(
                body.decode("utf-8", "replace"),
                keep_blank_values=True,
                max_num_fields=FORM_MAX_FIELDS,
            )
        except ValueError:
            raise _Answer(self.error(request, 400, "Too many form fields.")) from None
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
            return self.error(request, 503, exc.detail, headers=_RETRY)
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
            response = await handler(Call(request=request, caller=caller, form=form))
        except _Answer as answer:
            response = answer.response
        except JobqError as exc:
            response = self.error(request, _status(exc), exc.detail, caller=caller)
        except (DBAPIError, asyncpg.PostgresError) as exc:
            if not (sqlstate(exc) or "").startswith("22"):
                raise
            response = self.error(
                request, 400, "A value is out of range or malformed.", caller=caller
            )
        if caller.new_nonce is not None:
            set_cookie(response, request, NONCE_COOKIE, caller.new_nonce)
        return response

    # -- pages ------------------------------------------------------------------------------

    async def overview(self, call: Call) -> Response:
        """Queues with counts per state, oldest pending age, paused flag, and the last hour's throughput."""
        covers = call.caller.principal.covers
        queues = [dict(r) for r in await call.services.ops.queue_stats() if covers(r["name"])]
        throughput = await call.services.ops.queue_throughput(minutes=THROUGHPUT_MINUTES)
        chart = views.throughput_chart(
            throughput, now=datetime.now(UTC), visible=covers, minutes=THROUGHPUT_MINUTES
        )
        template = "fragments/overview.html" if call.fragment else "overview.html"
        return self.render(
            call.request, template, caller=call.caller, nav="overview", queues=queues, chart=chart
        )

    def _search(self, call: Call, filters: JobFilters) -> JobSearch:
        principal = call.caller.principal
        if filters.queue is not None and not principal.covers(filters.queue):
            raise Forbidden(f"Key {principal.name!r} is not scoped to queue {filters.queue!r}.")
        patterns = principal.like_patterns() if filters.queue is None else None
        return JobSearch(
            queue=filters.queue,
            status=filters.state,
            type=filters.type,
            payload=filters.payload,
            created_after=filters.created_after,
            created_before=filters.created_before,
            queue_patterns=tuple(patterns) if patterns is not None else None,
        )

    async def jobs(self, call: Call) -> Response:
        """Jobs newest first, filtered, with keyset paging and the bulk actions."""
        filters, errors = parse_filters(call.request.query_params, self.settings)
        template = "fragments/jobs.html" if call.fragment else "jobs.html"
        context: dict[str, Any] = {
            "filters": filters,
            "errors": errors,
            "jobs": [],
            "next_cursor": None,
            "totals": None,
            "bulk": bulk_offered(filters.state),
        }
        status = 200
        if not errors:
            try:
                search = self._search(call, filters)
                rows, next_cursor = await call.services.ops.search(
                    search, limit=PAGE_SIZE, after=filters.after
                )
            except (InvalidInput, Forbidden) as exc:
                errors.append(exc.detail if isinstance(exc, Forbidden) else _input_problem(exc))
                status = _status(exc)
            else:
                covers = call.caller.principal.covers
                stats = [r for r in await call.services.ops.queue_stats() if covers(r["name"])]
                context.update(
                    jobs=[dict(r) for r in rows],
                    next_cursor=next_cursor,
                    totals=views.state_totals(stats, STATES, queue=filters.queue),
                )
        else:
            status = 400
        return self.render(
            call.request, template, caller=call.caller, status=status, nav="jobs", **context
        )

    def _bulk_request(
        self, call: Call, fields: Mapping[str, str]
    ) -> tuple[BulkAction, JobFilters, JobSearch]:
        action_text = fields.get("action", "")
        if action_text not in {a.value for a in BULK_OFFERED}:
            raise _Answer(
                self.error(call.request, 400, "Choose retry or cancel.", caller=call.caller)
            )
        action = BulkAction(action_text)
        filters, errors = parse_filters(fields, self.settings)
        if errors:
            raise _Answer(self.error(call.request, 400, " ".join(errors), caller=call.caller))
        if bulk_states(action, filters.state) is None:
            allowed = ", ".join(s.value for s in JobStatus if s in BULK_STATES[action][0])
            raise _Answer(
                self.error(
                    call.request,
                    400,
                    f"Bulk {action.value} applies to {allowed} jobs; the filter asks for "
                    f"{filters.state.value if filters.state else 'none'}.",
                    caller=call.caller,
                )
            )
        return action, filters, self._search(call, filters)

    async def bulk_confirm(self, call: Call) -> Response:
        """The confirmation of a bulk action: exactly how many jobs it would change now."""
        action, filters, search = self._bulk_request(call, call.request.query_params)
        count = await call.services.ops.bulk_preview(action, search)
        touched = bulk_states(action, filters.state) or []
        return self.render(
            call.request,
            "bulk.html",
            caller=call.caller,
            nav="jobs",
            action=action.value,
            filters=filters,
            count=count,
            touched=[s.value for s in touched],
        )

    async def bulk_run(self, call: Call) -> Response:
        """Runs a confirmed bulk action; back to the jobs page with how many jobs it changed."""
        action, filters, search = self._bulk_request(call, call.form)
        principal = call.caller.principal
        outcome = await call.services.ops.bulk(
            action, search, actor=principal.name, actor_key_id=principal.key_id
        )
        noun = "job" if outcome.changed == 1 else "jobs"
        return self.redirect(
            call.request,
            filters.url(),
            Flash("ok", f"{_BULK_DONE[action]} {outcome.changed} {noun}"),
        )

    async def _job(self, call: Call) -> dict[str, Any]:
        job_id = _job_id(call.request.path_params.get("job_id", ""))
        row = dict(await call.services.jobs.get(job_id))
        if not call.caller.principal.covers(row["queue"]):
            raise Forbidden(
                f"Key {call.caller.principal.name!r} is not scoped to queue {row['queue']!r}."
            )
        return row

    async def job(self, call: Call) -> Response:
        """One job: payload, result, errors, progress, checkpoint, lease, timeline, actions."""
        row = await self._job(call)
        holder: dict[str, Any] | None = None
        if row["status"] == JobStatus.RUNNING:
            for worker in await call.services.ops.workers(
                queue_patterns=[like_pattern(row["queue"])]
            ):
                if row["id"] in (worker["job_ids"] or ()):
                    holder = dict(worker)
                    break
        template = "fragments/job.html" if call.fragment else "job.html"
        return self.render(
            call.request,
            template,
            caller=call.caller,
            nav="jobs",
            job=row,
            holder=holder,
            errors=views.job_errors(row.get("errors")),
            progress=views.progress_bar(row.get("progress")),
            timeline=views.timeline(row),
        )

    async def job_cancel(self, call: Call) -> Response:
        """Cancels one job; back to its page with the outcome."""
        return await self._job_action(call, "cancel")

    async def job_retry(self, call: Call) -> Response:
        """Retries one job; back to its page with the outcome."""
        return await self._job_action(call, "retry")

    async def _job_action(self, call: Call, verb: str) -> Response:
        row = await self._job(call)
        principal = call.caller.principal
        try:
            if verb == "cancel":
                await call.services.ops.cancel(
                    row["id"], actor=principal.name, actor_key_id=principal.key_id
                )
                flash = Flash("ok", f"Cancelled job {row['id']}")
            else:
                await call.services.ops.retry(
                    row["id"], actor=principal.name, actor_key_id=principal.key_id
                )
                flash = Flash("ok", f"Retried job {row['id']}: it is pending again")
        except InvalidTransition as exc:
            flash = Flash("error", exc.detail)
        return self.redirect(call.request, f"{PREFIX}/jobs/{row['id']}", flash)

    async def queue_pause(self, call: Call) -> Response:
        """Pauses a queue (claims skip it); back to the overview with the outcome."""
        return await self._queue_action(call, paused=True)

    async def queue_resume(self, call: Call) -> Response:
        """Resumes a queue; back to the overview with the outcome."""
        return await self._queue_action(call, paused=False)

    async def _queue_action(self, call: Call, *, paused: bool) -> Response:
        name = call.request.path_params["name"]
        queue_max = self.settings.queue_name_max_chars
        if not re.fullmatch(rf"[A-Za-z0-9][A-Za-z0-9_.:-]{{0,{queue_max - 1}}}", name):
            raise InvalidInput("That is not a queue name.")
        principal = call.caller.principal
        if not principal.covers(name):
            raise Forbidden(f"Key {principal.name!r} is not scoped to queue {name!r}.")
        try:
            await call.services.ops.set_paused(
                name, paused=paused, actor=principal.name, actor_key_id=principal.key_id
            )
        except NotFound:
            # Deleted since the overview was drawn; the overview shows it gone.
            return self.redirect(
                call.request, PREFIX, Flash("error", f"Queue {name} no longer exists")
            )
        done = "Paused" if paused else "Resumed"
        return self.redirect(call.request, PREFIX, Flash("ok", f"{done} queue {name}"))

    async def workers(self, call: Call) -> Response:
        """Who holds what: workers with leases, their keys, jobs, last heartbeat and next expiry."""
        rows = await call.services.ops.workers(queue_patterns=call.caller.principal.like_patterns())
        template = "fragments/workers.html" if call.fragment else "workers.html"
        return self.render(
            call.request,
            template,
            caller=call.caller,
            nav="workers",
            workers=[dict(r) for r in rows],
            links=WORKER_JOB_LINKS,
        )

    async def schedules(self, call: Call) -> Response:
        """Periodic schedules in name order: timing, zone, queue and type, next and last run."""
        after = call.request.query_params.get("after") or None
        errors: list[str] = []
        if after is not None and not SCHEDULE_NAME_PATTERN.fullmatch(after):
            errors.append("The page position (after) is malformed.")
            after = None
        rows: list[Any] = []
        next_cursor = None
        if not errors:
            rows, next_cursor = await call.services.schedules.list_page(
                limit=PAGE_SIZE,
                after=after,
                queue_patterns=call.caller.principal.like_patterns(),
            )
        template = "fragments/schedules.html" if call.fragment else "schedules.html"
        return self.render(
            call.request,
            template,
            caller=call.caller,
            status=400 if errors else 200,
            nav="schedules",
            schedules=[dict(r) for r in rows],
            errors=errors,
            after=after or "",
            next_query=urlencode({"after": next_cursor}) if next_cursor else "",
        )

    async def audit(self, call: Call) -> Response:
        """The audit trail, newest first, with keyset paging."""
        params = call.request.query_params
        errors: list[str] = []
        action = params.get("action") or None
        if action is not None and not _ACTION_PATTERN.fullmatch(action):
            errors.append("Unknown action.")
            action = None
        actor = params.get("actor") or None
        if actor is not None and (len(actor) > ACTOR_MAX_CHARS or "\x00" in actor):
            errors.append(f"An actor is at most {ACTOR_MAX_CHARS} characters, without NUL.")
            actor = None
        after = params.get("after") or None
        if after is not None and (len(after) > CURSOR_MAX_CHARS or not after.isascii()):
            errors.append("The page position (after) is malformed.")
            after = None
        entries: list[dict[str, Any]] = []
        next_cursor = None
        if not errors:
            try:
                rows, next_cursor = await call.services.ops.audit_list(
                    action=action,
                    actor=actor,
                    limit=PAGE_SIZE,
                    after=after,
                    queue_patterns=call.caller.principal.like_patterns(),
                )
                entries = [dict(r) for r in rows]
            except InvalidInput as exc:
                errors.append(_input_problem(exc))
        query = {k: v for k, v in (("action", action), ("actor", actor)) if v}
        template = "fragments/audit.html" if call.fragment else "audit.html"
        return self.render(
            call.request,
            template,
            caller=call.caller,
            status=400 if errors else 200,
            nav="audit",
            entries=entries,
            errors=errors,
            action=action or "",
            actor=actor or "",
            after=after or "",
            actions=[a.value for a in AuditAction],
            query=urlencode(query),
            next_query=urlencode({**query, "after": next_cursor}) if next_cursor else "",
        )

    # -- sign-in ------------------------------------------------------------------------------

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
        response = self.render(
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
            return self.error(request, 503, exc.detail, headers=_RETRY)
        next_target = safe_next(request.query_params.get("next"))
        if not enabled:
            return RedirectResponse(next_target or PREFIX, status_code=303)
        return self.login_form(request, next_target=next_target)

    async def login(self, request: Request) -> Response:
        """``POST /dashboard/login``: checks the key as the API would and starts the session."""
        try:
            enabled = auth_enabled(request)
            fields = await self.form(request)
        except DatabaseUnavailable as exc:
            return self.error(request, 503, exc.detail, headers=_RETRY)
        except _Answer as answer:
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
            fields = await self.form(request)
        except SignInNeeded as exc:
            return self.sign_in(request, clear=exc.clear)
        except (TooManyFailures, DatabaseUnavailable) as exc:
            response: Response = RedirectResponse(LOGIN, status_code=303)
            clear_cookie(response, request, SESSION_COOKIE)
            del exc
            return response
        except _Answer as answer:
            return answer.response
        if not caller.auth_on:
            return RedirectResponse(PREFIX, status_code=303)
        presented = fields.get(CSRF_FIELD) or request.headers.get(CSRF_HEADER)
        if not csrf_valid(csrf_basis(request, caller), presented):
            return self.error(
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
        return self.error(request, 404, "There is no such dashboard page.", caller=caller)


def _job_id(text: str) -> int:
    if not text.isascii() or not text.isdigit() or not 1 <= int(text) <= MAX_BIGINT:
        raise NotFound(f"job {text[:40]!r} not found")
    return int(text)


def _status(exc: JobqError) -> int:
    """The page's status for an error: the API's, except that unusable input is a 400 here."""
    if isinstance(exc, InvalidInput):
        return 400
    return ERROR_TABLE.get(type(exc), (400, "", ""))[0]


def _input_problem(exc: InvalidInput) -> str:
    if any("after" in str(e.get("field", "")) for e in exc.errors):
        return "The page position (after) is malformed; start again from the newest jobs."
    return exc.detail


def build_router(settings: Settings) -> APIRouter:
    """The dashboard's routes (all kept out of the OpenAPI document) and its static files."""
    board = Dashboard(settings)
    router = APIRouter(route_class=DashboardRoute, include_in_schema=False)

    def page(
        handler: Handler, *needs: Permission, action: bool = False
    ) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            return await board.run(request, handler, needs, action=action)

        endpoint.__doc__ = handler.__doc__
        return endpoint

    observe = (Permission.OBSERVE,)
    read = (Permission.OBSERVE, Permission.READ_JOBS)
    operate = (Permission.OBSERVE, Permission.OPERATE)

    routes: Iterable[tuple[str, str, Callable[[Request], Awaitable[Response]]]] = (
        ("GET", LOGIN, board.login_page),
        ("POST", LOGIN, board.login),
        ("POST", f"{PREFIX}/logout", board.logout),
        ("GET", PREFIX, page(board.overview, *observe)),
        ("GET", f"{PREFIX}/fragments/overview", page(board.overview, *observe)),
        ("POST", PREFIX + "/queues/{name}/pause", page(board.queue_pause, *operate, action=True)),
        ("POST", PREFIX + "/queues/{name}/resume", page(board.queue_resume, *operate, action=True)),
        ("GET", f"{PREFIX}/jobs", page(board.jobs, *read)),
        ("GET", f"{PREFIX}/fragments/jobs", page(board.jobs, *read)),
        ("GET", f"{PREFIX}/jobs/bulk", page(board.bulk_confirm, *read, Permission.OPERATE)),
        (
            "POST",
            f"{PREFIX}/jobs/bulk",
            page(board.bulk_run, *read, Permission.OPERATE, action=True),
        ),
        ("GET", PREFIX + "/jobs/{job_id}", page(board.job, *read)),
        ("GET", PREFIX + "/fragments/jobs/{job_id}", page(board.job, *read)),
        (
            "POST",
            PREFIX + "/jobs/{job_id}/cancel",
            page(board.job_cancel, *read, Permission.OPERATE, action=True),
        ),
        (
            "POST",
            PREFIX + "/jobs/{job_id}/retry",
            page(board.job_retry, *read, Permission.OPERATE, action=True),
        ),
        ("GET", f"{PREFIX}/workers", page(board.workers, *observe)),
        ("GET", f"{PREFIX}/fragments/workers", page(board.workers, *observe)),
        ("GET", f"{PREFIX}/schedules", page(board.schedules, *observe)),
        ("GET", f"{PREFIX}/fragments/schedules", page(board.schedules, *observe)),
        ("GET", f"{PREFIX}/audit", page(board.audit, *observe)),
        ("GET", f"{PREFIX}/fragments/audit", page(board.audit, *observe)),
    )
    for method, path, endpoint in routes:
        router.add_api_route(path, endpoint, methods=[method], response_class=HTMLResponse)
    router.routes.append(Mount(f"{PREFIX}/static", app=board.static, name="dashboard-static"))
    router.add_api_route(
        PREFIX + "/{rest:path}", board.not_found, methods=["GET"], response_class=HTMLResponse
    )
    return router
