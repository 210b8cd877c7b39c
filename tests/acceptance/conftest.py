"""Real ``jobq serve`` processes on the session's database, for the acceptance tests.

``jobq_servers`` is a factory: ``await jobq_servers.start(env={...})`` spawns
``python -m app.cli serve`` on a free port with ``DATABASE_URL`` set, waits until ``GET /readyz``
answers 200 (with a deadline) and answers a :class:`JobqServer`. Every process a test started is
stopped in teardown (SIGTERM, then SIGKILL), and its combined stdout/stderr, kept in a file under
``tmp_path``, is attached to the report of a failing test.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Generator, Iterator, Mapping
from pathlib import Path
from typing import IO

import httpx
import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
READY_TIMEOUT_SECONDS = 30.0
STOP_TIMEOUT_SECONDS = 12.0
LOG_TAIL_CHARS = 20_000

SERVERS_KEY = pytest.StashKey[list["JobqServer"]]()


def free_port() -> int:
    """A port that was free a moment ago on 127.0.0.1 (bound to port 0, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class JobqServer:
    """One ``jobq serve`` process and the file its output goes to."""

    def __init__(self, *, name: str, port: int, log_path: Path, env: Mapping[str, str]) -> None:
        self.name = name
        self.port = port
        self.log_path = log_path
        self.url = f"http://127.0.0.1:{port}"
        self._log: IO[bytes] = log_path.open("wb")
        try:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "app.cli",
                    "serve",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(port),
                ],
                cwd=REPO_ROOT,
                env=dict(env),
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=subprocess.STDOUT,
            )
        except BaseException:
            self._log.close()
            raise

    @property
    def pid(self) -> int:
        return self.process.pid

    def log_text(self, tail: int = LOG_TAIL_CHARS) -> str:
        """The last ``tail`` characters the process wrote."""
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError as exc:
            return f"<cannot read {self.log_path}: {exc}>"
        return text if len(text) <= tail else "...\n" + text[-tail:]

    def describe(self) -> str:
        return f"jobq serve {self.name} (pid {self.pid}, {self.url}, log {self.log_path})"

    async def wait_ready(self, within: float = READY_TIMEOUT_SECONDS) -> None:
        """Polls ``GET /readyz`` until it answers 200; fails if the process exits or time runs out."""
        deadline = time.monotonic() + within
        last = "no answer yet"
        async with httpx.AsyncClient(base_url=self.url, timeout=2.0) as client:
            while True:
                code = self.process.poll()
                if code is not None:
                    pytest.fail(
                        f"{self.describe()} exited with {code} before it was ready:\n"
                        f"{self.log_text()}"
                    )
                try:
                    response = await client.get("/readyz")
                    if response.status_code == 200 and response.json() == {"status": "ok"}:
                        return
                    last = f"{response.status_code} {response.text[:200]}"
                except httpx.TransportError as exc:
                    last = repr(exc)
                if time.monotonic() > deadline:
                    pytest.fail(
                        f"{self.describe()} not ready after {within} s (last: {last}):\n"
                        f"{self.log_text()}"
                    )
                await asyncio.sleep(0.1)

    def send_signal(self, sig: int) -> None:
        self.process.send_signal(sig)

    async def wait_exit(self, within: float) -> int | None:
        """The exit code once the process ends, or ``None`` if it still runs after ``within`` s."""
        deadline = time.monotonic() + within
        while True:
            code = self.process.poll()
            if code is not None:
                return code
            if time.monotonic() > deadline:
                return None
            await asyncio.sleep(0.05)

    def stop(self) -> None:
        """Teardown: SIGTERM, then SIGKILL if it lingers; always reaps it and closes the log."""
        try:
            if self.process.poll() is None:
                self.process.send_signal(signal.SIGTERM)
                try:
                    self.process.wait(timeout=STOP_TIMEOUT_SECONDS)
                except subprocess.TimeoutExpired:
                    self.process.kill()
                    self.process.wait(timeout=STOP_TIMEOUT_SECONDS)
        finally:
            self._log.close()


class JobqServers:
    """Starts ``jobq serve`` processes for one test and remembers them for teardown."""

    def __init__(self, *, database_url: str, log_dir: Path) -> None:
        self.database_url = database_url
        self.log_dir = log_dir
        self.servers: list[JobqServer] = []

    def spawn(self, env: Mapping[str, str] | None = None) -> JobqServer:
        """Starts a process without waiting for it."""
        child_env = {key: value for key, value in os.environ.items() if not key.startswith("JOBQ_")}
        child_env.update(
            {"DATABASE_URL": self.database_url, "PYTHONUNBUFFERED": "1", **(env or {})}
        )
        name = f"jobq-{len(self.servers) + 1}"
        server = JobqServer(
            name=name,
            port=free_port(),
            log_path=self.log_dir / f"{name}.log",
            env=child_env,
        )
        self.servers.append(server)
        return server

    async def start(self, env: Mapping[str, str] | None = None) -> JobqServer:
        """Starts a process and waits until it is ready."""
        server = self.spawn(env)
        await server.wait_ready()
        return server

    def stop_all(self) -> None:
        errors: list[BaseException] = []
        for server in self.servers:
            try:
                server.stop()
            except (OSError, subprocess.SubprocessError) as exc:  # keep stopping the others
                errors.append(exc)
        if errors:
            raise errors[0]


@pytest.fixture
def jobq_servers(
    database_url: str, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[JobqServers]:
    """A factory of real ``jobq serve`` processes on the session database; all stopped afterwards."""
    servers = JobqServers(database_url=database_url, log_dir=tmp_path)
    request.node.stash[SERVERS_KEY] = servers.servers
    try:
        yield servers
    finally:
        servers.stop_all()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Attaches the output of every ``jobq serve`` the test started to its failure report."""
    report: pytest.TestReport = yield
    if report.failed:
        for server in item.stash.get(SERVERS_KEY, []):
            report.sections.append((f"output of {server.describe()}", server.log_text()))
    return report
