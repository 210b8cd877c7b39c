"""Every code block of README.md and docs/**/*.md runs against a real ``jobq serve`` (issue 40).

One service on a database of its own serves the whole module; the blocks run in page order, as a
reader would run them, so a later example may use what an earlier one made. Per block:

- ``sh`` blocks of ``curl`` calls: each request is sent (parsed with shlex, sent with httpx; see
  :meth:`Tour.run_curls` for why not the curl binary) and its answer checked against the
  ``# -> STATUS {...}`` comment after it: the status, and every field the comment shows, with
  its value where it is literal. Ids are mapped (:class:`tests.docs_examples.IdMap`), times only
  checked to be times. A call without such a comment must answer 2xx.
- ``sh`` blocks of ``NAME=value`` lines: each name must be a setting and its value valid.
- ``python`` blocks run (top-level ``await`` allowed); ``sql`` blocks run on the database in a
  transaction rolled back; ``toml``, ``yaml`` and ``ini`` blocks parse.
- A block whose first line is a key of :data:`CHECKS` is run by that check instead: it gives the
  block what it needs around it (a worker to finish its jobs, the names it leaves unimported),
  runs it and checks what it did. The TypeScript and Go workers compile against their clients
  there, the JSON answer shapes and the log lines are compared with what the service answers,
  the webhook request with a real delivery.
- Anything else must be marked ``<!-- example: not run (why) -->`` on the line before it; a
  block neither run nor marked fails, naming its page, line and first line. A marked block that
  could run fails too.

``pytest tests/acceptance/test_readme_examples.py`` runs it (about 30 s). A block selected alone
(``-k 'README.md:29'``) runs without the blocks before it, so it fails where it needs them.
"""

from __future__ import annotations

import ast
import asyncio
import configparser
import contextlib
import inspect
import json
import os
import re
import subprocess
import tomllib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any, NoReturn
from urllib.parse import urlsplit

import httpx
import pytest
import yaml
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import NullPool

from app.api.schedules_file import load_schedules_file
from app.auth.keys import Role
from app.db import async_url, driver_dsn
from app.migrations import upgrade
from app.settings import Settings, env_name
from tests.conftest import create_database, drop_database
from tests.contract.drivers import (
    GO_DIR,
    TYPESCRIPT_DIR,
    go_binary,
    node_binary,
    npm_command,
    run_build,
    unavailable,
)
from tests.docs_examples import (
    Block,
    IdMap,
    ShellCommand,
    all_blocks,
    block_kind,
    map_request,
    mismatches,
    parse_curl,
    relaxed_json,
    request_job_ids,
    shell_commands,
    walk_items,
)
from tests.keys import make_key
from tests.polling import poll_until
from tests.processes import REGISTRY_KEY, JobqServer, JobqServers, ProcessRegistry
from tests.webhook_receiver import Received, receiver

pytestmark = pytest.mark.acceptance

WEBHOOK_SECRET = "readme-examples-webhook-secret"
SERVICE_ENV = {
    # Without API keys a callback_url needs JOBQ_WEBHOOK_SECRET (README, Completion webhooks).
    "JOBQ_WEBHOOK_SECRET": WEBHOOK_SECRET,
    # The delivery the README shows is received on 127.0.0.1 here.
    "JOBQ_WEBHOOK_ALLOWED_NETWORKS": "127.0.0.1/32",
    "JOBQ_WEBHOOK_INTERVAL_SECONDS": "0.1",
    # The README's log lines include a summary line: one a second instead of one a minute.
    "JOBQ_LOG_SUMMARY_SECONDS": "1",
}
# The service the README talks to, in the spellings it uses.
README_ORIGINS = ("http://127.0.0.1:8000", "http://localhost:8000")
SEED_QUEUE = "readme-seeds"  # jobs made for ids the README names without making them
JS_DIR = Path(__file__).resolve().parent / "readme_js"
BLOCKS = all_blocks()
BLOCK_TIMEOUT_SECONDS = 120  # a block waiting for a worker that never comes fails, not hangs


class ExampleFailed(AssertionError):
    """An example did not do what its page says."""


def fail(message: str) -> NoReturn:
    """Fails the block's test with ``message`` alone: it names the block and what went wrong."""
    pytest.fail(message, pytrace=False)


@dataclass
class Row:
    """A row of the ``export`` worker's table: what its ``read_chunk`` answers."""

    id: int


class Tour:
    """Runs the blocks in page order against one service, keeping what a reader would keep."""

    def __init__(
        self, server: JobqServer, database_url: str, engine: AsyncEngine, work_dir: Path
    ) -> None:
        self.server = server
        self.url = server.url
        self.database_url = database_url
        self.engine = engine
        self.work_dir = work_dir
        self.http = httpx.AsyncClient(base_url=server.url, timeout=30)
        self.ids = IdMap()
        self.leases: dict[int, str] = {}  # job id -> the lease id last seen for it
        self.delivery: Received | None = None  # the webhook the README's request block got
        self.deferred: list[tuple[str, Callable[[], Awaitable[None]]]] = []

    # -- dispatch ------------------------------------------------------------------------------

    def prepare(self, block: Block) -> Callable[[Block], Awaitable[None]]:
        """How to run the block; skips it if it is marked, fails if it is neither runnable nor marked."""
        if block.marker is not None and block.not_run_reason is None:
            fail(
                f"{block.describe()}: unknown marker {block.marker!r}; the one marker is "
                "<!-- example: not run (why) -->"
            )
        runner = self.runner_for(block)
        if block.not_run_reason is not None:
            if runner is not None:
                fail(
                    f"{block.describe()} is marked not run, but this test can run it: remove "
                    "the marker"
                )
            pytest.skip(f"not run: {block.not_run_reason}")
        if runner is None:
            fail(
                f"{block.describe()} is neither run nor marked. Make it runnable (curl calls, "
                "NAME=value settings, Python, SQL, TypeScript, Go, TOML, YAML, INI), register a "
                "check for its first line in CHECKS of tests/acceptance/test_readme_examples.py, "
                "or put <!-- example: not run (why) --> on the line before it."
            )
        return runner

    def runner_for(self, block: Block) -> Callable[[Block], Awaitable[None]] | None:
        """How this block is run; ``None`` when it cannot be."""
        check = CHECKS.get(block.first_line)
        if check is not None:
            return lambda b: check(self, b)
        try:
            kind = block_kind(block)
        except ValueError as exc:
            fail(f"{block.describe()}: {exc}")
        runners: dict[str, Callable[[Block], Awaitable[None]]] = {
            "curl": self.run_curls,
            "settings": self.check_settings,
            "python": self.run_python,
            "sql": self.run_sql,
            "toml": self.parse_toml,
            "yaml": self.parse_yaml,
            "ini": self.parse_ini,
        }
        return runners[kind] if kind is not None else None

    # -- curl ----------------------------------------------------------------------------------

    async def run_curls(self, block: Block) -> None:
        """Sends each curl call of the block and checks its answer; reports every failing call.

        The calls are parsed with shlex and sent with httpx rather than by the curl binary: the
        test needs the body as JSON anyway, to map the README's job ids to this run's and to fill
        ``"<lease_id from claim>"`` with the lease an earlier call got, and it can then compare
        the answer structurally. shlex splits words as sh does, and :func:`parse_curl` refuses
        any option it does not know, so nothing the README writes is silently dropped; a -d
        without a JSON content type is sent as curl sends it (form-encoded).
        """
        problems: list[str] = []
        for command in shell_commands(block.text):
            where = f"{block.path}:{block.content_line + command.line}"
            try:
                problems.extend(f"{where}: {p}" for p in await self.run_curl(command))
            except (ValueError, KeyError, httpx.HTTPError) as exc:
                problems.append(f"{where}: {type(exc).__name__}: {exc}")
        if problems:
            fail(f"{block.describe()}:\n" + "\n".join(problems))

    async def run_curl(self, command: ShellCommand) -> list[str]:
        """One curl call; answers what differs from its page."""
        _, words = command.split()  # no block sets a variable: $KEY is empty, as in sh
        request = parse_curl(words)
        parts = urlsplit(request.url)
        if f"{parts.scheme}://{parts.netloc}" not in README_ORIGINS:
            return [f"{request.url}: not the README's service (localhost:8000)"]
        path, problems = self.map_path(parts.path)
        content: str | None = request.body
        if request.body is not None:
            try:
                body = json.loads(request.body)
            except ValueError:
                body = None  # sent as written: the service says what is wrong with it
            if body is not None:
                for readme_id in request_job_ids(body):
                    if self.ids.real("job", readme_id) is None:
                        self.ids.learn("job", readme_id, await self.seed_job(readme_id))
                mapped, unknown = map_request(body, self.ids, self.fill_placeholder)
                problems.extend(unknown)
                if mapped != body:
                    content = json.dumps(mapped)
        if problems:
            return problems
        url = path + (f"?{parts.query}" if parts.query else "")
        response = await self.http.request(
            request.method, url, headers=request.headers, content=content
        )
        answer = _json_or_none(response)
        self.remember_leases(answer)
        said = f"{request.method} {path} answered {response.status_code} {response.text[:600]}"
        if command.expect is None:
            if not 200 <= response.status_code < 300:
                return [f"{said} (no answer shown, so a 2xx was expected)"]
            return []
        if response.status_code != command.expect.status:
            return [f"{said}, the README says {command.expect.text}"]
        if command.expect.body is None:
            return []
        found = mismatches(command.expect.body, answer, ids=self.ids, top_kind=_resource_kind(path))
        return [f"{request.method} {path}: {p}" for p in found]

    def map_path(self, path: str) -> tuple[str, list[str]]:
        """``/v1/jobs/1`` with the README's id replaced by this run's."""
        found = re.match(r"^/v1/(jobs|workflows)/(\d+)(/.*)?$", path)
        if found is None:
            return path, []
        kind = "job" if found.group(1) == "jobs" else "workflow"
        real = self.ids.real(kind, int(found.group(2)))
        if real is None:
            return path, [f"{path}: {kind} {found.group(2)} was never shown by an example"]
        return f"/v1/{found.group(1)}/{real}{found.group(3) or ''}", []

    def fill_placeholder(self, name: str, item: dict[str, Any]) -> Any:
        """A ``"<lease_id from claim>"``: the lease an earlier answer gave that job."""
        if name == "lease_id" and item.get("job_id") in self.leases:
            return self.leases[item["job_id"]]
        raise ValueError(f"no value for the placeholder in {name!r} of {item}")

    def remember_leases(self, answer: Any) -> None:
        """Keeps every (job, lease) an answer shows, for later placeholders."""
        for item in walk_items(answer):
            if isinstance(item.get("id"), int) and isinstance(item.get("lease_id"), str):
                self.leases[item["id"]] = item["lease_id"]

    async def seed_job(self, readme_id: int) -> int:
        """A job standing for the README's ``readme_id``, which no example made; answers its id."""
        body = {"queue": SEED_QUEUE, "type": "seed", "payload": {"readme_id": readme_id}}
        response = await self.http.post("/v1/jobs", json=body)
        assert response.status_code == 201, response.text
        real: int = response.json()["id"]
        return real

    # -- settings ------------------------------------------------------------------------------

    async def check_settings(self, block: Block) -> None:
        """``NAME=value`` lines: each a setting jobq reads, with a value it accepts."""
        known = {env_name(name): name for name in Settings.model_fields}
        given: dict[str, str] = {}
        for command in shell_commands(block.text):
            assignments, _ = command.split()
            for name, value in assignments.items():
                if name not in known:
                    fail(f"{block.describe()}: {name} is not a jobq setting")
                given[name] = value
        settings = Settings(**{_init_name(known[name]): value for name, value in given.items()})
        for name in ("database_url", "direct_database_url"):
            url = getattr(settings, name)
            if url is not None:
                async_url(url)  # what jobq does with it first; raises on a malformed URL

    # -- Python, SQL, configuration ------------------------------------------------------------

    async def run_python(self, block: Block, namespace: dict[str, Any] | None = None) -> None:
        """Runs a Python block (top-level ``await`` allowed) with the service's URL in it."""
        source = block.text
        for origin in README_ORIGINS:
            source = source.replace(origin, self.url)
        # Blank lines first, so that a traceback names the page's own line numbers.
        code = compile(
            "\n" * (block.content_line - 1) + source,
            block.path,
            "exec",
            flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT,
            dont_inherit=True,
        )
        scope: dict[str, Any] = {"__name__": f"readme_example_{block.line}"}
        scope.update(namespace or {})
        if code.co_flags & inspect.CO_COROUTINE:
            await eval(code, scope)
        else:  # blocking code (psycopg, a sync Session) runs off the event loop
            await asyncio.to_thread(exec, code, scope)
        if namespace is not None:
            namespace.update(scope)

    async def run_sql(self, block: Block, setup: str = "") -> None:
        """Runs a SQL block on the service's database in a transaction that is rolled back."""
        import asyncpg

        conn = await asyncpg.connect(driver_dsn(self.database_url))
        try:
            transaction = conn.transaction()
            await transaction.start()
            try:
                if setup:
                    await conn.execute(setup)
                await conn.execute(block.text)
            finally:
                await transaction.rollback()
        finally:
            await conn.close()

    async def parse_toml(self, block: Block) -> None:
        """TOML parses."""
        tomllib.loads(block.text)

    async def parse_yaml(self, block: Block) -> None:
        """YAML parses."""
        yaml.safe_load(block.text)

    async def parse_ini(self, block: Block) -> None:
        """INI parses."""
        configparser.ConfigParser().read_string(block.text)

    # -- helpers for the checks ----------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def running(self, worker: Any) -> AsyncIterator[None]:
        """A ``jobq_client`` Worker running in this event loop while the block lasts."""
        task = asyncio.create_task(worker.run(install_signal_handlers=False))
        try:
            yield
        finally:
            worker.stop()
            await asyncio.wait_for(task, timeout=30)

    async def until_finished(self, job_id: int, within: float = 20) -> dict[str, Any]:
        """The job once it is finished (long-polled by the service)."""
        deadline = asyncio.get_running_loop().time() + within
        while True:
            response = await self.http.get(f"/v1/jobs/{job_id}", params={"wait_seconds": 2})
            assert response.status_code == 200, response.text
            job: dict[str, Any] = response.json()
            if job["status"] in ("succeeded", "dead", "cancelled"):
                return job
            if asyncio.get_running_loop().time() > deadline:
                raise ExampleFailed(f"job {job_id} not finished within {within} s: {job}")

    async def claim(self, queue: str, max_jobs: int = 10) -> list[dict[str, Any]]:
        """``POST /v1/claim`` on one queue, without waiting."""
        response = await self.http.post(
            "/v1/claim", json={"worker_id": "readme-tour", "queues": [queue], "max_jobs": max_jobs}
        )
        assert response.status_code == 200, response.text
        jobs: list[dict[str, Any]] = response.json()["jobs"]
        return jobs

    async def settle(self, call: str, job: dict[str, Any], **fields: Any) -> None:
        """``POST /v1/{call}`` (complete, fail, release) for one claimed job; it must be held."""
        item = {"job_id": job["id"], "lease_id": job["lease_id"], **fields}
        response = await self.http.post(
            f"/v1/{call}", json={"worker_id": "readme-tour", "leases": [item]}
        )
        assert response.status_code == 200 and response.json()["results"][0]["ok"], response.text

    async def log_records(self) -> list[dict[str, Any]]:
        """The service's log lines so far, as JSON records."""
        records = []
        for line in self.server.log_text(tail=10**9).splitlines():
            if line.startswith("{"):
                with contextlib.suppress(ValueError):
                    records.append(json.loads(line))
        return records


def _json_or_none(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return None


def _resource_kind(path: str) -> str:
    """What a top-level ``id`` of this route's answer numbers."""
    found = re.match(r"^/v1/([a-z_]+)", path)
    resource = found.group(1) if found else ""
    return {"jobs": "job", "workflows": "workflow", "limits": "limit"}.get(resource, resource)


def _init_name(field: str) -> str:
    """The keyword Settings takes for a field: its environment alias where it has one."""
    alias = Settings.model_fields[field].validation_alias
    return env_name(field) if alias is not None else field


# -- checks for particular blocks, by their first line -------------------------------------------


async def check_enqueue_and_wait(tour: Tour, block: Block) -> None:
    """``enqueue_and_wait``: a worker finishes the job while the block waits; it prints the result."""
    from jobq_client import Worker

    worker = Worker(tour.url, queues=["thumbs"], wait_seconds=1)

    @worker.handler("resize")
    async def resize(ctx: Any) -> dict[str, Any]:
        return {"thumbnail": f"{ctx.payload['image']}.webp"}

    printed: list[Any] = []
    async with tour.running(worker):
        await tour.run_python(block, {"KEY": None, "print": printed.append})
    assert printed == [{"thumbnail": "42.webp"}], printed


async def _orders_table(tour: Tour) -> None:
    async with tour.engine.begin() as conn:
        await conn.execute(
            text(
                "CREATE TABLE IF NOT EXISTS orders (id bigint PRIMARY KEY, total numeric NOT NULL)"
            )
        )


async def _check_order_and_job(tour: Tour, order_id: int, job_id: Any, key: bool) -> None:
    """The order row and its job committed together, as the block says."""
    async with tour.engine.connect() as conn:
        order = (
            await conn.execute(text("SELECT total FROM orders WHERE id = :id"), {"id": order_id})
        ).scalar_one_or_none()
        job = (
            (
                await conn.execute(
                    text(
                        "SELECT id, queue, type, payload, idempotency_key FROM jobs WHERE id = :id"
                    ),
                    {"id": int(job_id)},
                )
            )
            .mappings()
            .one_or_none()
        )
    assert order is not None, f"order {order_id} was not committed"
    assert job is not None, f"job {job_id} was not committed"
    assert (job["queue"], job["type"], job["payload"]) == ("emails", "receipt", {"order": order_id})
    assert job["idempotency_key"] == (f"receipt-{order_id}" if key else None), job


async def check_psycopg(tour: Tour, block: Block) -> None:
    """psycopg 3: the order and its job in one transaction."""
    import psycopg
    from psycopg.types.json import Jsonb

    await _orders_table(tour)
    scope: dict[str, Any] = {
        "psycopg": psycopg,
        "Jsonb": Jsonb,
        "dsn": driver_dsn(tour.database_url),
        "order_id": 1001,
        "total": Decimal("12.50"),
    }
    await tour.run_python(block, scope)
    await _check_order_and_job(tour, 1001, scope["job_id"], key=True)


async def check_asyncpg(tour: Tour, block: Block) -> None:
    """asyncpg: the order and its job in one transaction."""
    import asyncpg

    await _orders_table(tour)
    conn = await asyncpg.connect(driver_dsn(tour.database_url))
    try:
        scope: dict[str, Any] = {"conn": conn, "json": json, "order_id": 1002, "total": 12}
        await tour.run_python(block, scope)
    finally:
        await conn.close()
    await _check_order_and_job(tour, 1002, scope["job_id"], key=False)


async def check_sqlalchemy(tour: Tour, block: Block) -> None:
    """SQLAlchemy: the order (an ORM object) and its job in the session's transaction."""
    from sqlalchemy import Column, Numeric, create_engine
    from sqlalchemy.orm import DeclarativeBase, Session

    class Base(DeclarativeBase):
        pass

    class Order(Base):
        __tablename__ = "orders"
        id = Column(Numeric, primary_key=True)
        total = Column(Numeric, nullable=False)

    await _orders_table(tour)
    url = driver_dsn(tour.database_url).replace("postgresql://", "postgresql+psycopg://", 1)
    engine = create_engine(url, poolclass=NullPool)
    try:
        scope: dict[str, Any] = {
            "Session": Session,
            "engine": engine,
            "Order": Order,
            "text": text,
            "json": json,
            "order_id": 1003,
            "total": Decimal("7.25"),
        }
        await tour.run_python(block, scope)
    finally:
        engine.dispose()
    await _check_order_and_job(tour, 1003, scope["job_id"], key=False)


def _npm_install(directory: Path) -> dict[str, str]:
    """``npm ci`` in ``directory`` when its lock file is newer than what is installed."""
    node = node_binary()
    env = {"PATH": f"{Path(node).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    installed = directory / "node_modules" / ".package-lock.json"
    lock = directory / "package-lock.json"
    if not installed.is_file() or installed.stat().st_mtime < lock.stat().st_mtime:
        run_build([*npm_command(node), "ci", "--no-audit", "--no-fund"], directory, env)
    return env


async def check_node_postgres(tour: Tour, block: Block) -> None:
    """node-postgres: runs in Node with the ``pg`` package against the database."""
    await _orders_table(tour)
    await asyncio.to_thread(_npm_install, JS_DIR)
    folder = tour.work_dir / "node-postgres"
    folder.mkdir(exist_ok=True)
    with contextlib.suppress(FileExistsError):
        (folder / "node_modules").symlink_to(JS_DIR / "node_modules")
    script = folder / "example.mjs"
    script.write_text(
        'import pg from "pg";\n'
        "const pool = new pg.Pool({ connectionString: process.env.DATABASE_URL });\n"
        "const orderId = 1004;\nconst total = 3.5;\n" + block.text + "await pool.end();\n",
        encoding="utf-8",
    )
    done = await asyncio.to_thread(
        subprocess.run,
        [node_binary(), str(script)],
        env={**os.environ, "DATABASE_URL": driver_dsn(tour.database_url)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, f"node exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    async with tour.engine.connect() as conn:
        job_id = (
            await conn.execute(
                text("SELECT id FROM jobs WHERE payload = CAST(:p AS jsonb)"),
                {"p": json.dumps({"order": 1004})},
            )
        ).scalar_one()
    await _check_order_and_job(tour, 1004, job_id, key=False)


async def check_parents(tour: Tour, block: Block) -> None:
    """What a claim hands a job that waited: one parent succeeded with a result, one dead."""
    expected = relaxed_json(block.text)
    parents = []
    for readme_id in (41, 42):
        real = tour.ids.real("job", readme_id)
        if real is None:
            real = await tour.seed_job(readme_id)
            tour.ids.learn("job", readme_id, real)
        parents.append(real)
    response = await tour.http.post(
        "/v1/jobs",
        json={
            "queue": "readme-parents",
            "type": "merge",
            "depends_on": parents,
            "on_parent_failure": "run",
        },
    )
    assert response.status_code == 201, response.text
    held = {job["id"]: job for job in await tour.claim(SEED_QUEUE)}
    assert set(parents) <= set(held), f"the parents {parents} were not claimable: {sorted(held)}"
    await tour.settle("complete", held[parents[0]], result={"rows": 3})
    await tour.settle("fail", held[parents[1]], error="no such table", retryable=False)
    [job] = await tour.claim("readme-parents", max_jobs=1)
    found = mismatches(expected, job["parents"], ids=tour.ids)
    assert not found, f"{block.describe()}:\n" + "\n".join(found)


async def check_composing_client(tour: Tour, block: Block) -> None:
    """The client's workflow, batch and ordering calls; then the block's own worker runs a step."""
    from jobq_client import Worker

    helper = Worker(tour.url, queues=["etl"], wait_seconds=1)
    for step in ("extract", "transform", "load"):

        @helper.handler(step)
        async def handle(ctx: Any, step: str = step) -> dict[str, Any]:
            return {"rows": 3, "step": step}

    scope: dict[str, Any] = {}
    async with tour.running(helper):
        await tour.run_python(block, scope)
    assert scope["done"]["state"] == "succeeded", scope["done"]
    assert len(scope["batch"]) == 100 and scope["batch"].callback["status"] == "waiting"
    lean = scope["lean"]
    assert set(lean) == {"ids", "created", "callback_id"}, lean
    assert lean["created"] == [True] and lean["callback_id"] is None, lean

    # The block's worker, with its transform handler (and one for the step before it).
    worker = scope["worker"]

    @worker.handler("extract")
    async def extract(ctx: Any) -> dict[str, Any]:
        return {"rows": 5}

    response = await tour.http.post(
        "/v1/workflows",
        json={
            "name": "readme-transform",
            "steps": [
                {"name": "extract", "queue": "etl", "type": "extract"},
                {"name": "transform", "queue": "etl", "type": "transform", "after": ["extract"]},
            ],
        },
    )
    assert response.status_code == 201, response.text
    steps = {step["name"]: step for step in response.json()["steps"]}
    async with tour.running(worker):
        job = await tour.until_finished(steps["transform"]["job"]["id"])
    assert job["status"] == "succeeded", job


async def check_export_worker(tour: Tour, block: Block) -> None:
    """``my_worker.py``: its worker runs an export in chunks, checkpointing after each."""
    rows = [Row(i) for i in range(1, 6)]
    written: list[int] = []

    async def read_chunk(after: int) -> list[Row]:
        return [row for row in rows if row.id > after][:2]

    async def write(chunk: list[Row]) -> None:
        written.extend(row.id for row in chunk)

    scope: dict[str, Any] = {"read_chunk": read_chunk, "write": write}
    await tour.run_python(block, scope)
    response = await tour.http.post("/v1/jobs", json={"queue": "emails", "type": "export"})
    assert response.status_code == 201, response.text
    async with tour.running(scope["worker"]):
        job = await tour.until_finished(response.json()["id"])
    assert job["status"] == "succeeded", job
    assert job["result"] == {"last_id": 5} and job["checkpoint"] == {"last_id": 5}, job
    assert job["progress"] == {"done": 5}, job
    assert written == [1, 2, 3, 4, 5], written


def _typescript_project(folder: Path, block: Block) -> Path:
    """A project of one file, the block with its imports, compiled with the client's options."""
    folder.mkdir(parents=True, exist_ok=True)
    index = os.path.relpath(TYPESCRIPT_DIR / "src" / "index.js", folder)
    (folder / "example.mts").write_text(
        f'import {{ Worker }} from "{index}";\n'
        "declare function send(payload: unknown, signal: AbortSignal): Promise<boolean>;\n"
        + block.text,
        encoding="utf-8",
    )
    client = json.loads((TYPESCRIPT_DIR / "tsconfig.json").read_text(encoding="utf-8"))
    options = {
        key: value
        for key, value in client["compilerOptions"].items()
        if key not in ("rootDir", "outDir", "declaration", "sourceMap")
    }
    options.update(
        noEmit=True,
        typeRoots=[str(TYPESCRIPT_DIR / "node_modules" / "@types")],
        # Kept between runs (the folder is too): the client's files are checked again only when
        # they change.
        incremental=True,
        tsBuildInfoFile="example.tsbuildinfo",
    )
    config = folder / "tsconfig.json"
    config.write_text(
        json.dumps({"compilerOptions": options, "files": ["example.mts"]}), encoding="utf-8"
    )
    return config


async def check_typescript(tour: Tour, block: Block) -> None:
    """The TypeScript worker compiles (``tsc --noEmit``) against the client, ``send`` declared."""
    await asyncio.to_thread(_npm_install, TYPESCRIPT_DIR)
    # Under node_modules/, which git ignores, so that tsc's incremental state outlives the run.
    config = _typescript_project(JS_DIR / "node_modules" / ".typescript-example", block)
    tsc = TYPESCRIPT_DIR / "node_modules" / "typescript" / "bin" / "tsc"
    done = await asyncio.to_thread(
        subprocess.run,
        [node_binary(), str(tsc), "-p", str(config)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, f"tsc:\n{done.stdout}\n{done.stderr}"


async def check_go(tour: Tour, block: Block) -> None:
    """The Go worker compiles (``go vet``) in a main package with the client, ``send`` defined."""
    go = go_binary()
    if go is None:
        unavailable("no go command: apt-get install golang-go (Go 1.19 or newer)")
        return
    module = (GO_DIR / "go.mod").read_text(encoding="utf-8").split()[1]
    folder = tour.work_dir / "go"
    folder.mkdir(exist_ok=True)
    (folder / "go.mod").write_text(
        f"module readmeexample\n\ngo 1.19\n\nrequire {module} v0.0.0\n\n"
        f"replace {module} => {GO_DIR}\n",
        encoding="utf-8",
    )
    body = "\n".join("\t" + line if line else line for line in block.text.splitlines())
    (folder / "main.go").write_text(
        'package main\n\nimport (\n\t"context"\n\t"os/signal"\n\t"syscall"\n\n'
        f'\tjobq "{module}"\n)\n\n'
        "func send(ctx context.Context, jc *jobq.JobContext) (any, error) { return nil, nil }\n\n"
        f"func main() {{\n{body}\n}}\n",
        encoding="utf-8",
    )
    done = await asyncio.to_thread(
        subprocess.run,
        [go, "vet", "."],
        cwd=folder,
        env={**os.environ, "GOFLAGS": "-mod=mod", "GOPROXY": "off"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, f"go vet:\n{done.stdout}\n{done.stderr}"


async def check_enqueue_signature(tour: Tour, block: Block) -> None:
    """``jobq.enqueue(...)``: the parameters, types, defaults and result the catalog holds."""
    import asyncpg

    found = re.match(
        r"^\s*jobq\.enqueue\((?P<args>.*)\)\s*RETURNS\s+(?P<result>\w+)", block.text, re.S
    )
    assert found is not None, f"{block.describe()}: not a signature"
    shown = [_parameter(p) for p in _split_top(found.group("args").split("--")[0])]
    conn = await asyncpg.connect(driver_dsn(tour.database_url))
    try:
        row = await conn.fetchrow(
            "SELECT pg_get_function_arguments(p.oid) AS args, pg_get_function_result(p.oid) AS result"
            " FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace"
            " WHERE n.nspname = 'jobq' AND p.proname = 'enqueue'"
        )
        assert row is not None, "no function jobq.enqueue"
        shown = [
            (name, await conn.fetchval("SELECT $1::regtype::text", type_), default)
            for name, type_, default in shown
        ]
        result = await conn.fetchval("SELECT $1::regtype::text", found.group("result"))
    finally:
        await conn.close()
    actual = [_parameter(p.replace(" DEFAULT ", " = ")) for p in _split_top(row["args"])]
    assert shown == actual, f"README: {shown}\ncatalog: {actual}"
    assert result == row["result"], (result, row["result"])


def _split_top(args: str) -> list[str]:
    parts, depth, current = [], 0, ""
    for char in args:
        depth += char == "("
        depth -= char == ")"
        if char == "," and depth == 0:
            parts.append(current.strip())
            current = ""
        else:
            current += char
    if current.strip():
        parts.append(current.strip())
    return parts


def _parameter(text_: str) -> tuple[str, str, str | None]:
    """``name type [= default]`` -> name, type, default without its cast, lower case."""
    head, _, default = text_.partition("=")
    name, _, type_ = head.strip().partition(" ")
    if default:
        default = re.sub(r"::[a-z ]+$", "", default.strip()).lower()
    return name, type_.strip(), default or None


async def check_jit_role(tour: Tour, block: Block) -> None:
    """``ALTER ROLE jobq SET jit = off``: runs (on a role ``jobq`` made for it if there is none)."""
    await tour.run_sql(
        block,
        setup="DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'jobq') THEN "
        "CREATE ROLE jobq; END IF; END $$",
    )


async def check_schedules_file(tour: Tour, block: Block) -> None:
    """The schedules file: parsed and validated by the loader ``JOBQ_SCHEDULES`` uses."""
    path = tour.work_dir / "schedules.toml"
    path.write_text(block.text, encoding="utf-8")
    loaded = load_schedules_file(path, Settings())
    assert [name for name, _ in loaded] == ["nightly-report", "poll-feeds"], loaded


PROMETHEUS_KEYS = {
    "scrape_configs": {"job_name", "authorization", "static_configs", "metrics_path", "scheme"},
    "authorization": {"type", "credentials", "credentials_file"},
    "static_configs": {"targets", "labels"},
}


async def check_prometheus(tour: Tour, block: Block) -> None:
    """prometheus.yml: parses, uses only keys of Prometheus' scrape config, scrapes /metrics."""
    config = yaml.safe_load(block.text)
    assert set(config) == {"scrape_configs"}, config
    for scrape in config["scrape_configs"]:
        assert set(scrape) <= PROMETHEUS_KEYS["scrape_configs"], scrape
        assert set(scrape.get("authorization", {})) <= PROMETHEUS_KEYS["authorization"], scrape
        for static in scrape["static_configs"]:
            assert set(static) <= PROMETHEUS_KEYS["static_configs"], static
            assert all(re.match(r"^[\w.-]+:\d+$", t) for t in static["targets"]), static
        assert scrape.get("metrics_path", "/metrics") == "/metrics"
    response = await tour.http.get("/metrics")
    assert response.status_code == 200 and "jobq_build_info" in response.text


RULE_KEYS = {"alert", "expr", "for", "labels", "annotations"}


async def check_alert_rules(tour: Tour, block: Block) -> None:
    """Prometheus rules: the file's shape, and every jobq_ series an expr names exists."""
    rules = yaml.safe_load(block.text)
    assert set(rules) == {"groups"}, rules
    scraped = (await tour.http.get("/metrics")).text
    exposed: set[str] = set()
    for name, kind in re.findall(r"^# TYPE (jobq_\w+) (\w+)$", scraped, re.MULTILINE):
        exposed.add(name)
        if kind == "histogram":
            exposed.update(f"{name}_{part}" for part in ("bucket", "sum", "count"))
    named = 0
    for group in rules["groups"]:
        assert set(group) == {"name", "rules"}, group
        for rule in group["rules"]:
            assert {"alert", "expr"} <= set(rule) <= RULE_KEYS, rule
            assert re.fullmatch(r"[A-Z][A-Za-z]+", rule["alert"]), rule["alert"]
            for series in re.findall(r"\b(jobq_\w+)", rule["expr"]):
                assert series in exposed, f"{rule['alert']}: {series} is not exposed"
                named += 1
    assert named >= 5


LOG_FIELDS = {"time", "level", "event", "message", "logger"}


async def check_log_lines(tour: Tour, block: Block) -> None:
    """The log lines shown have the fields the service writes for the same events."""
    shown = [json.loads(line) for line in block.text.splitlines() if line.strip()]
    for record in shown:
        assert set(record) >= LOG_FIELDS, record
    # What makes those lines: a 404, a failed job, and (deferred) a refused key.
    response = await tour.http.get("/v1/jobs/999999", headers={"X-Request-ID": "readme-logs"})
    assert response.status_code == 404, response.text
    response = await tour.http.post("/v1/jobs", json={"queue": "readme-logs", "type": "welcome"})
    assert response.status_code == 201, response.text
    [job] = await tour.claim("readme-logs", max_jobs=1)
    await tour.settle("fail", job, error="SMTP 451")
    # Which line of each event is compared: the one this check made.
    mine = {"http.request": ("request_id", "readme-logs"), "job.failed": ("job_id", job["id"])}

    def written(records: list[dict[str, Any]], event: str) -> list[dict[str, Any]]:
        """The lines of ``event`` to compare with the README's: those this check caused."""
        field, value = mine.get(event, ("event", event))
        return [r for r in records if r.get("event") == event and r.get(field) == value]

    async def compare(events: set[str]) -> None:
        async def all_written() -> bool:
            records = await tour.log_records()
            return all(written(records, event) for event in events)

        await poll_until(all_written, within=10, what=f"log lines for {sorted(events)}")
        records = await tour.log_records()
        problems = []
        for record in shown:
            if record["event"] not in events:
                continue
            actual = written(records, record["event"])[-1]
            if set(actual) != set(record) or (actual["level"], actual["logger"]) != (
                record["level"],
                record["logger"],
            ):
                problems.append(
                    f"{record['event']}: the README shows {sorted(record)} ({record['level']}, "
                    f"{record['logger']}), the service writes {sorted(actual)} "
                    f"({actual['level']}, {actual['logger']})"
                )
        assert not problems, "\n".join(problems)

    events = {record["event"] for record in shown}
    await compare(events - {"auth.rejected"})
    if "auth.rejected" in events:

        async def refused_key() -> None:
            # Last of all: a key in the database turns authentication on for good.
            await make_key(tour.engine, "readme-logs", Role.VIEWER)

            async def refused() -> bool:
                r = await tour.http.get("/v1/queues", headers={"Authorization": "Bearer jobq_1_x"})
                return r.status_code == 401

            await poll_until(refused, within=10, what="authentication to come on")
            await compare({"auth.rejected"})

        tour.deferred.append((f"{block.id} auth.rejected", refused_key))


async def check_webhook_request(tour: Tour, block: Block) -> None:
    """The webhook request: headers and body as a real delivery of a completed job has them."""
    head, _, body_text = block.text.partition("\n\n")
    request_line, *header_lines = head.splitlines()
    method, path, _ = request_line.split(" ")
    shown_headers = dict(line.split(": ", 1) for line in header_lines)
    shown_body = relaxed_json(body_text)
    queue, job_type = shown_body["queue"], shown_body["type"]
    async with receiver() as hooks:
        response = await tour.http.post(
            "/v1/jobs", json={"queue": queue, "type": job_type, "callback_url": hooks.url(path)}
        )
        assert response.status_code == 201, response.text
        mine = response.json()["id"]
        # The README's queue may hold its other examples' jobs: take this one, hand the rest back.
        held = await tour.claim(queue, max_jobs=100)
        for job in held:
            if job["id"] == mine:
                await tour.settle("complete", job, result=shown_body["result"])
            else:
                await tour.settle("release", job)
        assert mine in [job["id"] for job in held], held
        await poll_until(lambda: bool(hooks.received), within=15, what="the webhook")
    got = hooks.received[0]
    tour.delivery = got
    assert (method, got.path) == ("POST", path), got
    missing = {name for name in shown_headers if name.lower() not in got.headers} - {"Host"}
    assert not missing, f"headers shown but not sent: {missing} (sent: {sorted(got.headers)})"
    for name in ("Content-Type", "User-Agent"):
        assert got.headers[name.lower()].split(";")[0] == shown_headers[name], got.headers
    assert re.fullmatch(r"t=\d+,v1=[0-9a-f]{64}", got.headers["jobq-signature"]), got.headers
    assert set(got.json) == set(shown_body), (
        f"the README's body has {sorted(shown_body)}, the delivery {sorted(got.json)}"
    )
    found = mismatches(shown_body, got.json, ids=IdMap())
    assert not found, "\n".join(found)


async def check_verify_signature(tour: Tour, block: Block) -> None:
    """``receive()``: accepts the real delivery, refuses it altered, and skips a duplicate."""
    if tour.delivery is None:
        raise ExampleFailed("needs the delivery of the webhook request block before it")
    delivery = tour.delivery
    headers = {name.title(): value for name, value in delivery.headers.items()}
    seen: set[str] = set()
    handled: list[Any] = []
    scope: dict[str, Any] = {
        "SECRET": WEBHOOK_SECRET,
        "json": json,
        "already_seen": seen.__contains__,
        "handle": handled.append,
    }
    await tour.run_python(block, scope)
    receive = scope["receive"]
    assert receive(delivery.body, headers) == 200 and handled == [delivery.json]
    assert receive(delivery.body + b" ", headers) == 400
    seen.add(headers["Jobq-Delivery-Id"])
    assert receive(delivery.body, headers) == 200 and len(handled) == 1


Check = Callable[[Tour, Block], Awaitable[None]]
# A block whose first line is a key here is run by that check instead of by its language's.
CHECKS: dict[str, Check] = {
    "from jobq_client import Client": check_enqueue_and_wait,
    "with psycopg.connect(dsn) as conn:": check_psycopg,
    "async with conn.transaction():": check_asyncpg,
    "with Session(engine) as session, session.begin():": check_sqlalchemy,
    "const client = await pool.connect();": check_node_postgres,
    '{"total": 2, "succeeded": 1, "dead": 1, "cancelled": 0, "failed_ids": [42],': check_parents,
    "from jobq_client import Callback, Client, Step, Worker": check_composing_client,
    "# my_worker.py": check_export_worker,
    "// TypeScript": check_typescript,
    "// Go": check_go,
    "jobq.enqueue(queue text, type text, payload jsonb = 'null', priority int = 0,": (
        check_enqueue_signature
    ),
    "ALTER ROLE jobq SET jit = off;   -- or, in pgbouncer.ini's [databases] line: connect_query='SET jit = off'": (
        check_jit_role
    ),
    "[[schedules]]": check_schedules_file,
    "# prometheus.yml": check_prometheus,
    "# jobq-alerts.yml": check_alert_rules,
    '{"time":"2026-12-01T14:28:30.580Z","level":"info","event":"http.request","message":"127.0.0.1:59084 - \\"GET /v1/jobs/999999 HTTP/1.1\\" 404 in 15.0 ms","logger":"jobq.access","client":"127.0.0.1:59084","method":"GET","path":"/v1/jobs/999999","http_version":"1.1","status_code":404,"duration_ms":15.0,"request_id":"p-1"}': (
        check_log_lines
    ),
    "POST /hooks/jobq HTTP/1.1": check_webhook_request,
    "from jobq_client import InvalidSignature, verify_signature": check_verify_signature,
}


# -- fixtures and tests -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tour_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProcessRegistry]:
    """The module's processes: its one ``jobq serve``."""
    registry = ProcessRegistry(tmp_path_factory.mktemp("readme-service"))
    try:
        yield registry
    finally:
        registry.stop_all()


@pytest.fixture(scope="module")
async def tour(
    tour_registry: ProcessRegistry, pg_server_url: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Tour]:
    """A service on a database of its own (ids as a reader's fresh one), and the tour's state."""
    url = await asyncio.to_thread(create_database, pg_server_url, "jobq_readme")
    try:
        await asyncio.to_thread(upgrade, url)
        server = await JobqServers(tour_registry, url).start(SERVICE_ENV)
        engine = create_async_engine(async_url(url), poolclass=NullPool)
        made = Tour(server, url, engine, tmp_path_factory.mktemp("readme-work"))
        try:
            yield made
        finally:
            await made.http.aclose()
            await engine.dispose()
            server.stop()
    finally:
        await asyncio.to_thread(drop_database, pg_server_url, url)


@pytest.mark.parametrize("block", BLOCKS, ids=[block.id for block in BLOCKS])
async def test_example(
    block: Block, tour: Tour, tour_registry: ProcessRegistry, request: pytest.FixtureRequest
) -> None:
    """The block runs and does what its page says (or is marked not run, with the reason)."""
    runner = tour.prepare(block)
    request.node.stash[REGISTRY_KEY] = tour_registry  # a failure's report shows the service's log
    await asyncio.wait_for(runner(block), timeout=BLOCK_TIMEOUT_SECONDS)


async def test_deferred_checks(
    tour: Tour, tour_registry: ProcessRegistry, request: pytest.FixtureRequest
) -> None:
    """Checks that must come after every block (they turn authentication on)."""
    request.node.stash[REGISTRY_KEY] = tour_registry
    for name, check in tour.deferred:
        try:
            await check()
        except AssertionError as exc:
            raise ExampleFailed(f"{name}: {exc}") from exc


def test_every_check_names_one_block() -> None:
    """A check whose block changed its first line (or went) would silently stop checking it."""
    firsts = [block.first_line for block in BLOCKS]
    stale = [line for line in CHECKS if firsts.count(line) != 1]
    assert not stale, f"checks matching no block, or several: {stale}"


def test_the_marker_reasons_are_given() -> None:
    """Every marker says why its block is not run."""
    bad = [b.describe() for b in BLOCKS if b.marker is not None and b.not_run_reason is None]
    assert not bad, bad
