"""Headless Chromium against a real ``jobq serve``: the browser, the server, its keys, screenshots.

The browser is the system's Chromium (Debian: ``apt-get install chromium chromium-driver``),
driven by Playwright's Python package with ``executable_path``: nothing is downloaded, ever
(``playwright install`` is never needed). ``JOBQ_CHROMIUM`` names another binary.

Without Chromium or Playwright each test file here is collected as one stand-in (never
imported) that is skipped with a line saying what is missing and how to install it, except when
``CI=true``: then it fails with that line instead, so CI can never pass without running them.

One ``jobq serve`` process (API keys on: admin, viewer and worker keys), on a database of its own,
and one browser serve the whole module; each test gets a fresh browser context (its own cookies)
and a folder of step screenshots under ``JOBQ_ARTIFACTS`` (default
``tests/system/browser/artifacts``).
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
from collections.abc import AsyncIterator, Generator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import pytest
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

from app.auth import store
from app.auth.keys import Role
from app.db import async_url
from app.migrations import upgrade
from tests.conftest import create_database, drop_database
from tests.processes import REGISTRY_KEY, REPO_ROOT, JobqServer, JobqServers, ProcessRegistry

if TYPE_CHECKING:
    from playwright.async_api import (
        Browser,
        BrowserContext,
        ConsoleMessage,
        Page,
        Request,
        ViewportSize,
    )

INSTALL_HINT = "apt-get install chromium chromium-driver"
CHROMIUM_CANDIDATES = ("chromium", "/usr/bin/chromium", "chromium-browser")
VIEWPORT: ViewportSize = {"width": 1280, "height": 800}
SCREENSHOTS_DIR = REPO_ROOT / "docs" / "screenshots"
IN_CI = os.environ.get("CI", "").strip().lower() in {"true", "1"}


def chromium_path() -> str | None:
    """The Chromium binary to drive: ``JOBQ_CHROMIUM`` if set, else the first one on PATH."""
    configured = os.environ.get("JOBQ_CHROMIUM")
    if configured:
        return configured if os.access(configured, os.X_OK) else None
    for candidate in CHROMIUM_CANDIDATES:
        found = shutil.which(candidate)
        if found:
            return found
    return None


def browser_problem() -> str | None:
    """What keeps the browser tests from running here, with how to fix it, or ``None``."""
    if importlib.util.find_spec("playwright") is None:
        return "the Python package playwright is missing: pip install -e '.[test]'"
    if chromium_path() is None:
        where = os.environ.get("JOBQ_CHROMIUM") or ", ".join(CHROMIUM_CANDIDATES)
        return f"Chromium is not installed (looked for {where}): {INSTALL_HINT}"
    return None


PROBLEM = browser_problem()


class BrowserMissing(pytest.Item):
    """Stands for a test file that cannot run here: skips, or fails when ``CI=true``."""

    def runtest(self) -> None:
        """Skips with what is missing and how to install it; fails instead under CI."""
        if IN_CI:
            pytest.fail(f"CI=true, so the browser tests fail instead of skipping: {PROBLEM}")
        pytest.skip(f"browser tests skipped: {PROBLEM}")

    def reportinfo(self) -> tuple[Path, int | None, str]:
        """Names the test file it stands for."""
        return self.path, None, f"{self.path.name}: {PROBLEM}"


class BrowserMissingFile(pytest.File):
    """A test file collected without importing it (it needs Playwright): one stand-in item."""

    def collect(self) -> Iterator[pytest.Item]:
        """The one stand-in."""
        yield BrowserMissing.from_parent(self, name="needs-chromium")


@pytest.hookimpl(tryfirst=True)
def pytest_pycollect_makemodule(module_path: Path, parent: pytest.Collector) -> pytest.File | None:
    """Without Chromium or Playwright, collects each test file as its stand-in instead."""
    if PROBLEM is None:
        return None
    return BrowserMissingFile.from_parent(parent, path=module_path)


def pytest_configure(config: pytest.Config) -> None:
    """Registers the ``browser`` marker (``pytest -m "not browser"`` leaves these tests out)."""
    config.addinivalue_line("markers", "browser: drives the dashboard in headless Chromium")


def artifacts_root() -> Path:
    """Where step screenshots go: ``JOBQ_ARTIFACTS``, else ``tests/system/browser/artifacts``."""
    configured = os.environ.get("JOBQ_ARTIFACTS")
    return Path(configured).resolve() if configured else Path(__file__).parent / "artifacts"


def readme_screenshots_wanted() -> bool:
    """Whether ``JOBQ_SCREENSHOTS=1`` asks for the docs' screenshots in ``docs/screenshots``."""
    return os.environ.get("JOBQ_SCREENSHOTS", "") == "1"


# The keys the server knows, by name (as ``jobq keys create --name`` names them): the operator's
# admin key, an on-call viewer, and one worker key per team, so the pages show real key names.
KEY_ROLES = {
    "ops-admin": Role.ADMIN,
    "oncall-viewer": Role.VIEWER,
    "mailer": Role.WORKER,
    "reporting": Role.WORKER,
}


@dataclass(frozen=True)
class Dashboard:
    """The server under test, its keys by name and an HTTP client on its API with the admin key."""

    server: JobqServer
    keys: dict[str, str]
    api: httpx.AsyncClient

    @property
    def url(self) -> str:
        """The server's origin, ``http://127.0.0.1:PORT``."""
        return self.server.url

    @property
    def admin_key(self) -> str:
        """The admin key's secret."""
        return self.keys["ops-admin"]

    @property
    def viewer_key(self) -> str:
        """The viewer key's secret."""
        return self.keys["oncall-viewer"]

    def client(self, key_name: str) -> httpx.AsyncClient:
        """A new client on the API sending the key named ``key_name`` (close it after use)."""
        return api_client(self.url, self.keys[key_name])


def api_client(url: str, secret: str) -> httpx.AsyncClient:
    """An HTTP client on the API at ``url`` sending ``secret`` as its bearer token."""
    return httpx.AsyncClient(
        base_url=url, headers={"Authorization": f"Bearer {secret}"}, timeout=10.0
    )


@pytest.fixture(scope="module")
def browser_database_url(pg_server_url: str) -> Iterator[str]:
    """A migrated database for this module's server alone (no other test writes to it)."""
    url = create_database(pg_server_url, prefix="jobq_browser")
    try:
        upgrade(url)
        yield url
    finally:
        drop_database(pg_server_url, url)


async def _make_keys(database_url: str) -> dict[str, str]:
    """The keys of ``KEY_ROLES``, made as ``jobq keys create`` makes them; answers their secrets."""
    engine = create_async_engine(async_url(database_url), poolclass=NullPool)
    try:
        async with engine.begin() as conn:
            return {
                name: await store.create_key(conn, name=name, role=role, queues=None)
                for name, role in KEY_ROLES.items()
            }
    finally:
        await engine.dispose()


@pytest.fixture(scope="module")
def server_processes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProcessRegistry]:
    """The module's process registry: its server's output is attached to any failing test."""
    registry = ProcessRegistry(tmp_path_factory.mktemp("browser-server"))
    try:
        yield registry
    finally:
        registry.stop_all()


@pytest.fixture(scope="module")
async def dashboard(
    browser_database_url: str, server_processes: ProcessRegistry
) -> AsyncIterator[Dashboard]:
    """A real ``jobq serve`` with API keys on (keys made before it starts), and an admin client."""
    keys = await _make_keys(browser_database_url)
    server = await JobqServers(server_processes, browser_database_url).start(
        # One instance name on the workers page, run to run; a quicker refresh than the default.
        env={"JOBQ_INSTANCE_NAME": "api-1", "JOBQ_DASHBOARD_REFRESH_SECONDS": "2"}
    )
    async with api_client(server.url, keys["ops-admin"]) as api:
        yield Dashboard(server=server, keys=keys, api=api)


@pytest.fixture(autouse=True)
def _server_output_on_failure(
    request: pytest.FixtureRequest, server_processes: ProcessRegistry
) -> None:
    """Makes ``tests.processes``' report hook attach the server's output to a failing test."""
    request.node.stash[REGISTRY_KEY] = server_processes


@pytest.fixture(scope="module")
async def browser() -> AsyncIterator[Browser]:
    """One headless Chromium for the module: the system's binary, nothing downloaded."""
    from playwright.async_api import async_playwright

    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(executable_path=chromium_path(), headless=True)
        try:
            yield launched
        finally:
            await launched.close()


PHASES_KEY = pytest.StashKey[dict[str, pytest.TestReport]]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Keeps each phase's report on the item, so fixtures know in teardown whether the test failed."""
    report: pytest.TestReport = yield
    item.stash.setdefault(PHASES_KEY, {})[report.when] = report
    return report


def _test_failed(request: pytest.FixtureRequest) -> bool:
    phases = request.node.stash.get(PHASES_KEY, {})
    return any(report.failed for report in phases.values())


class Steps:
    """Saves a numbered full-page screenshot of each step of one test under the artifacts folder."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.count = 0
        shutil.rmtree(folder, ignore_errors=True)  # only this run's steps stay
        folder.mkdir(parents=True, exist_ok=True)

    async def shot(self, page: Page, label: str) -> Path:
        """Screenshots ``page`` as the next step, named ``NN-label.png``; answers the file."""
        self.count += 1
        path = self.folder / f"{self.count:02d}-{label}.png"
        await page.screenshot(path=str(path), full_page=True)
        return path

    async def readme(self, page: Page, name: str) -> None:
        """With ``JOBQ_SCREENSHOTS=1``, also saves ``page`` as ``docs/screenshots/<name>.png``."""
        await self.shot(page, name)
        if readme_screenshots_wanted():
            SCREENSHOTS_DIR.mkdir(parents=True, exist_ok=True)
            await page.screenshot(path=str(SCREENSHOTS_DIR / f"{name}.png"), full_page=True)


@pytest.fixture
def steps(request: pytest.FixtureRequest) -> Steps:
    """This test's step screenshots, in ``<artifacts>/<test name>/``."""
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", request.node.name).strip("-")
    return Steps(artifacts_root() / name)


@dataclass
class PageLog:
    """What the pages of one context did: every request URL and every uncaught script error."""

    requests: list[Request] = field(default_factory=list)
    ended: int = 0
    errors: list[str] = field(default_factory=list)
    console_errors: list[str] = field(default_factory=list)

    def sent(self, request: Request) -> None:
        """Records a request as it leaves the page."""
        self.requests.append(request)

    def end(self, _: Request) -> None:
        """Counts a request that finished or failed."""
        self.ended += 1

    def in_flight(self) -> int:
        """Requests sent and not yet answered."""
        return len(self.requests) - self.ended

    def urls(self) -> list[str]:
        """Every URL requested so far, in order."""
        return [r.url for r in self.requests]

    def console(self, message: ConsoleMessage) -> None:
        """Keeps what a page logged as an error (a refused load, a CSP violation, a 404)."""
        if message.type == "error":
            self.console_errors.append(f"{message.text} ({message.location.get('url')})")

    def watch(self, page: Page) -> None:
        """Logs this page's script errors and console errors."""
        page.on("pageerror", lambda exc: self.errors.append(str(exc)))
        page.on("console", self.console)

    def refreshes(self) -> int:
        """Requests made from scripts (htmx's XHR / fetch), as opposed to navigations."""
        return sum(1 for r in self.requests if r.resource_type in {"xhr", "fetch"})


@pytest.fixture
def page_log() -> PageLog:
    """The request and error log of this test's browser context."""
    return PageLog()


@pytest.fixture
async def context(
    browser: Browser,
    dashboard: Dashboard,
    page_log: PageLog,
    steps: Steps,
    request: pytest.FixtureRequest,
) -> AsyncIterator[BrowserContext]:
    """A fresh context (no cookies) at 1280x800 on the server, logging requests and page errors.

    A failing test leaves a screenshot of each of its pages as ``failure-N.png`` and a Playwright
    trace, ``trace.zip`` (every action with the DOM before and after it, the network and the
    console: ``playwright show-trace trace.zip``, offline). A script error on any page fails the
    test in teardown: the dashboard must run without one.
    """
    ctx = await browser.new_context(viewport=VIEWPORT, base_url=dashboard.url)
    ctx.set_default_timeout(10_000)
    ctx.on("request", page_log.sent)
    ctx.on("requestfinished", page_log.end)
    ctx.on("requestfailed", page_log.end)
    ctx.on("page", page_log.watch)
    await ctx.tracing.start(snapshots=True)
    try:
        yield ctx
        if _test_failed(request):
            for number, open_page in enumerate(ctx.pages, start=1):
                await steps.shot(open_page, f"failure-{number}")
            await ctx.tracing.stop(path=steps.folder / "trace.zip")
        else:
            await ctx.tracing.stop()
    finally:
        await ctx.close()
    assert not page_log.errors, f"script errors on the dashboard: {page_log.errors}"


@pytest.fixture
async def page(context: BrowserContext) -> Page:
    """A page in this test's context."""
    return await context.new_page()
