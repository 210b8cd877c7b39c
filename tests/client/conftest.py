"""Fixtures for the client's integration tests: real ``jobq serve`` and ``jobq worker`` processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import IO

import pytest

from tests.acceptance.conftest import REPO_ROOT, JobqServers

STOP_TIMEOUT_SECONDS = 15.0
PROCESSES_KEY = pytest.StashKey[list["JobqServers | WorkerProcesses"]]()


class WorkerProcess:
    """One ``jobq worker module:attr --url URL`` process and the file its output goes to."""

    def __init__(self, *, target: str, url: str, log_path: Path) -> None:
        self.target = target
        self.log_path = log_path
        self._log: IO[bytes] = log_path.open("wb")
        env = {k: v for k, v in os.environ.items() if not k.startswith("JOBQ_")}
        env["PYTHONUNBUFFERED"] = "1"
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "app.cli", "worker", target, "--url", url],
                cwd=REPO_ROOT,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=subprocess.STDOUT,
            )
        except BaseException:
            self._log.close()
            raise

    def log_text(self) -> str:
        """Everything the process wrote so far."""
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def describe(self) -> str:
        return f"jobq worker {self.target} (pid {self.process.pid}, log {self.log_path})"

    def wait_exit(self, within: float) -> int | None:
        """The exit code, or ``None`` if the process still runs after ``within`` seconds."""
        try:
            return self.process.wait(timeout=within)
        except subprocess.TimeoutExpired:
            return None

    def stop(self) -> None:
        """Teardown: SIGTERM, then SIGKILL if it lingers; always reaps it and closes the log."""
        try:
            if self.process.poll() is None:
                self.process.send_signal(signal.SIGTERM)
                if self.wait_exit(STOP_TIMEOUT_SECONDS) is None:
                    self.process.kill()
                    self.process.wait(timeout=STOP_TIMEOUT_SECONDS)
        finally:
            self._log.close()


class WorkerProcesses:
    """Starts worker processes for one test and stops them all afterwards."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.workers: list[WorkerProcess] = []

    def start(self, target: str, url: str) -> WorkerProcess:
        """Starts ``jobq worker target --url url`` from the repository root."""
        worker = WorkerProcess(
            target=target,
            url=url,
            log_path=self.log_dir / f"worker-{len(self.workers) + 1}-{time.monotonic_ns()}.log",
        )
        self.workers.append(worker)
        return worker

    def stop_all(self) -> None:
        for worker in self.workers:
            worker.stop()


@pytest.fixture
def jobq_servers(
    database_url: str, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[JobqServers]:
    """A factory of real ``jobq serve`` processes on the session database; all stopped afterwards."""
    servers = JobqServers(database_url=database_url, log_dir=tmp_path)
    request.node.stash.setdefault(PROCESSES_KEY, []).append(servers)
    try:
        yield servers
    finally:
        servers.stop_all()


@pytest.fixture
def worker_processes(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[WorkerProcesses]:
    """A factory of real ``jobq worker`` processes; all stopped afterwards."""
    workers = WorkerProcesses(tmp_path)
    request.node.stash.setdefault(PROCESSES_KEY, []).append(workers)
    try:
        yield workers
    finally:
        workers.stop_all()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Attaches the output of every server and worker process the test started to its failure."""
    report: pytest.TestReport = yield
    if report.failed:
        for group in item.stash.get(PROCESSES_KEY, []):
            members = group.servers if isinstance(group, JobqServers) else group.workers
            for process in members:
                report.sections.append((f"output of {process.describe()}", process.log_text()))
    return report
