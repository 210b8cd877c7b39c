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

Where things are: one module per page in ``pages/`` (each lists its ``ROUTES``), sign-in in
``signin.py``, the renderer and the checks every page passes in ``board.py``, paths, headers
and static files in ``base.py``. A new page is one module there and one entry in ``PAGES``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from fastapi import APIRouter, Request, Response
from fastapi.responses import HTMLResponse
from starlette.routing import Mount

from app.dashboard.base import CONTENT_SECURITY_POLICY, LOGIN, PREFIX, DashboardRoute
from app.dashboard.board import Board, Route
from app.dashboard.pages import (
    audit,
    failures,
    job,
    jobs,
    limits,
    overview,
    queues,
    schedules,
    workers,
    workflow,
)
from app.dashboard.signin import SignIn
from app.settings import Settings

__all__ = ["CONTENT_SECURITY_POLICY", "PAGES", "DashboardRoute", "build_router"]

# In route order: the jobs page's /jobs/bulk and /jobs/picked come before the job page's
# /jobs/{job_id}.
PAGES: tuple[tuple[Route, ...], ...] = (
    overview.ROUTES,
    queues.ROUTES,
    jobs.ROUTES,
    job.ROUTES,
    workflow.ROUTES,
    workers.ROUTES,
    failures.ROUTES,
    limits.ROUTES,
    schedules.ROUTES,
    audit.ROUTES,
)


def build_router(settings: Settings) -> APIRouter:
    """The dashboard's routes (all kept out of the OpenAPI document) and its static files."""
    board = Board(settings)
    signin = SignIn(board)
    router = APIRouter(route_class=DashboardRoute, include_in_schema=False)

    def endpoint(route: Route) -> Callable[[Request], Awaitable[Response]]:
        async def guarded(request: Request) -> Response:
            return await board.run(request, route.handler, route.needs, action=route.action)

        guarded.__doc__ = route.handler.__doc__
        return guarded

    def add(method: str, path: str, handler: Callable[[Request], Awaitable[Response]]) -> None:
        router.add_api_route(path, handler, methods=[method], response_class=HTMLResponse)

    add("GET", LOGIN, signin.login_page)
    add("POST", LOGIN, signin.login)
    add("POST", f"{PREFIX}/logout", signin.logout)
    for routes in PAGES:
        for route in routes:
            add(route.method, route.path, endpoint(route))
    router.routes.append(Mount(f"{PREFIX}/static", app=board.static, name="dashboard-static"))
    add("GET", PREFIX + "/{rest:path}", signin.not_found)
    return router
