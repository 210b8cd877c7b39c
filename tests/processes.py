"""Real child processes for tests: ``jobq serve``, ``jobq worker`` and anything else (Node workers).

One registry per test starts them from the repository root with their output in a file under
``tmp_path``, stops every one in teardown (SIGTERM, then SIGKILL) and attaches the output of all
of them to the report of a failing test. Fixtures: ``processes`` (any command), ``jobq_servers``
(``await jobq_servers.start(env=...)`` waits until ``GET /readyz`` answers) and
``worker_processes`` (``worker_processes.start("module:attr", url)``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Generator, Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO

import httpx
import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
READY_TIMEOUT_SECONDS = 30.0
STOP_TIMEOUT_SECONDS = 12.0
LOG_TAIL_CHARS = 20_000

REGISTRY_KEY = pytest.StashKey["ProcessRegistry"]()


def run_to_end(
    argv: Sequence[str], *, env: Mapping[str, str], timeout: float
) -> subprocess.CompletedProcess[str]:
    """Runs a command that starts processes of its own (a bench and its ``jobq serve``) in a
    process group of its own, and answers as ``subprocess.run`` does. After ``timeout`` seconds
    the whole group is killed and the test fails with the output so far: ``subprocess.run``
    would kill only the command and leave its server running."""
    process = subprocess.Popen(
        list(argv),
        cwd=REPO_ROOT,
        env=dict(env),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        out, err = process.communicate()
        pytest.fail(
            f"{' '.join(argv[:4])} still running after {timeout:g} s, killed with its "
            f"processes:\n{out[-4000:]}\n{err[-4000:]}"
        )
    finally:
        # Anything the command left behind (it exited, its children did not) goes too.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
    return subprocess.CompletedProcess(list(argv), process.returncode, out, err)


def free_port() -> int:
    """A port that was free a moment ago on 127.0.0.1 (bound to port 0, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def clean_environment(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment without ``JOBQ_*`` settings, plus ``extra``."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("JOBQ_")}
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


class ChildProcess:
    """One child process (run in the repository root) and the file its output goes to."""

    def __init__(
        self, *, name: str, argv: Sequence[str], env: Mapping[str, str], log_path: Path
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self._log: IO[bytes] = log_path.open("wb")
        try:
            self.process = subprocess.Popen(
                self.argv,
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
        """The process id."""
        return self.process.pid

    def log_text(self, tail: int = LOG_TAIL_CHARS) -> str:
        """The last ``tail`` characters the process wrote."""
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError as exc:
            return f"<cannot read {self.log_path}: {exc}>"
        return text if len(text) <= tail else "...\n" + text[-tail:]

    def describe(self) -> str:
        """Name, pid and log file, for reports."""
        return f"{self.name} (pid {self.pid}, log {self.log_path})"

    def send_signal(self, sig: int) -> None:
        """Sends ``sig`` to the process."""
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
            await asyncio.sleep(0.02)

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


class JobqServer(ChildProcess):
    """A ``jobq serve`` process on a free port."""

    def __init__(
        self,
        *,
        name: str,
        port: int,
        env: Mapping[str, str],
        log_path: Path,
        extra_args: Sequence[str] = (),
    ) -> None:
        argv = [
            sys.executable,
            "-m",
            "app.cli",
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            *extra_args,
        ]
        super().__init__(name=name, argv=argv, env=env, log_path=log_path)
        self.port = port
        self.url = f"http://127.0.0.1:{port}"

    def describe(self) -> str:
        """Name, pid, URL and log file, for reports."""
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


class ProcessRegistry:
    """Every process one test started, for teardown and failure reports."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.children: list[ChildProcess] = []

    def _log_path(self, name: str) -> Path:
        return self.log_dir / f"{name}-{len(self.children) + 1}.log"

    def spawn(self, name: str, argv: Sequence[str], env: Mapping[str, str]) -> ChildProcess:
        """Starts ``argv`` with exactly ``env`` (plus unbuffered Python output)."""
        child = ChildProcess(
            name=name,
            argv=argv,
            env={"PYTHONUNBUFFERED": "1", **env},
            log_path=self._log_path(name),
        )
        self.children.append(child)
        return child

    def stop_all(self) -> None:
        """Stops every process, even if stopping one fails."""
        errors: list[BaseException] = []
        for child in self.children:
            try:
                child.stop()
            except (OSError, subprocess.SubprocessError) as exc:
                errors.append(exc)
        if errors:
            raise errors[0]


class JobqServers:
    """Starts ``jobq serve`` processes on one database."""

    def __init__(self, registry: ProcessRegistry, database_url: str) -> None:
        self.registry = registry
        self.database_url = database_url

    @property
    def servers(self) -> list[JobqServer]:
        """The servers started so far."""
        return [c for c in self.registry.children if isinstance(c, JobqServer)]

    def spawn(self, env: Mapping[str, str] | None = None) -> JobqServer:
        """Starts a server without waiting for it."""
        name = f"jobq-{len(self.servers) + 1}"
        server = JobqServer(
            name=name,
            port=free_port(),
            env=clean_environment({"DATABASE_URL": self.database_url, **(env or {})}),
            log_path=self.registry._log_path(name),
        )
        self.registry.children.append(server)
        return server

    async def start(self, env: Mapping[str, str] | None = None) -> JobqServer:
        """Starts a server and waits until it is ready."""
        server = self.spawn(env)
        await server.wait_ready()
        return server


class WorkerProcesses:
    """Starts ``jobq worker module:attr --url URL`` processes."""

    def __init__(self, registry: ProcessRegistry) -> None:
        self.registry = registry

    def start(self, target: str, url: str, env: Mapping[str, str] | None = None) -> ChildProcess:
        """Starts a worker process for ``target`` against the service at ``url``."""
        argv = [sys.executable, "-m", "app.cli", "worker", target, "--url", url]
        return self.registry.spawn(f"jobq-worker-{target}", argv, clean_environment(env))


@pytest.fixture
def processes(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[ProcessRegistry]:
    """A factory of child processes; all stopped after the test, their output kept for failures."""
    registry = ProcessRegistry(tmp_path)
    request.node.stash[REGISTRY_KEY] = registry
    try:
        yield registry
    finally:
        registry.stop_all()


@pytest.fixture
def jobq_servers(processes: ProcessRegistry, database_url: str) -> JobqServers:
    """A factory of real ``jobq serve`` processes on the session database."""
    return JobqServers(processes, database_url)


@pytest.fixture
def worker_processes(processes: ProcessRegistry) -> WorkerProcesses:
    """A factory of real ``jobq worker`` processes."""
    return WorkerProcesses(processes)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Attaches the output of every process the test started to its failure report."""
    report: pytest.TestReport = yield
    registry = item.stash.get(REGISTRY_KEY, None)
    if report.failed and registry is not None:
        for child in registry.children:
            report.sections.append((f"output of {child.describe()}", child.log_text()))
    return report
