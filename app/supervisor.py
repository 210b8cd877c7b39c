"""``jobq serve --workers N``: N server processes on one port, supervised by the first.

One Python process spends a core at most, and the HTTP stack is where a request's time goes.
With ``--workers N`` the parent migrates the database (and starts the embedded server) once,
then runs N children, each a whole instance: its own pools, control connection and long-poll
hub. They share the listening port through ``SO_REUSEPORT`` (the kernel spreads connections);
the maintenance loops still run once, on whichever instance holds the leader lock, and parked
claims wake across processes through the same LISTEN / NOTIFY as across hosts.

The parent restarts a child that dies, forwards SIGTERM / SIGINT to all of them, and exits 0
when every child stopped cleanly within the grace period.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from types import FrameType

logger = logging.getLogger("jobq.supervisor")

RESTART_BACKOFF_SECONDS = 1.0
POLL_SECONDS = 0.2


def reuse_port_socket(host: str, port: int) -> socket.socket:
    """A listening socket that other processes may bind to the same address too."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


class Supervisor:
    """Runs ``count`` copies of ``argv`` and keeps them running until told to stop."""

    def __init__(
        self, *, argv: Sequence[str], env: Mapping[str, str], count: int, grace_seconds: float
    ) -> None:
        if count < 1:
            raise ValueError("count must be >= 1")
        self.argv = list(argv)
        self.env = dict(env)
        self.count = count
        self.grace_seconds = grace_seconds
        self.children: list[subprocess.Popen[bytes] | None] = [None] * count
        self._stopping = False

    def _start(self, slot: int) -> None:
        env = {**self.env, "JOBQ_WORKER_INDEX": str(slot)}
        self.children[slot] = subprocess.Popen(self.argv, env=env)

    def _stop(self, sig: int, _frame: FrameType | None) -> None:
        self._stopping = True
        for child in self.children:
            if child is not None and child.poll() is None:
                child.send_signal(sig)

    def run(self) -> int:
        """Starts the children, supervises them, and answers the exit status after a stop."""
        previous = {s: signal.signal(s, self._stop) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            for slot in range(self.count):
                self._start(slot)
            logger.info("supervising %d server processes", self.count)
            while not self._stopping:
                for slot, child in enumerate(self.children):
                    if child is not None and child.poll() is not None and not self._stopping:
                        logger.error(
                            "server process %d exited with %s; restarting it",
                            child.pid,
                            child.returncode,
                        )
                        # Said and done with: a stop during the backoff must not count it again
                        # (the supervisor answered 1 for a child it had already replaced).
                        self.children[slot] = None
                        time.sleep(RESTART_BACKOFF_SECONDS)
                        if not self._stopping:
                            self._start(slot)
                time.sleep(POLL_SECONDS)
            return self._wait_all()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _wait_all(self) -> int:
        deadline = time.monotonic() + self.grace_seconds
        status = 0
        for child in self.children:
            if child is None:
                continue
            try:
                code = child.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                logger.error("server process %d outlived the grace period; killing it", child.pid)
                child.kill()
                code = child.wait()
            # A child still starting when the stop came dies by the forwarded signal: that
            # is a clean stop too (it served nothing yet).
            clean = code in (0, -signal.SIGTERM, -signal.SIGINT)
            status = status or (0 if clean else 1)
        return status


def child_argv(host: str, port: int, log_level: str) -> list[str]:
    """The command line of one supervised server process."""
    return [
        sys.executable,
        "-m",
        "app.cli",
        "serve",
        "--supervised",
        "--host",
        host,
        "--port",
        str(port),
        "--log-level",
        log_level,
    ]


def child_environment(database_url: str) -> dict[str, str]:
    """The parent's environment with the database it resolved (and migrated)."""
    return {**os.environ, "DATABASE_URL": database_url}
