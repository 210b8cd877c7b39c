"""The supervisor of ``jobq serve --workers N``, with real child processes (sleeping Pythons)."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading

from app.supervisor import Supervisor

SLEEPER = [sys.executable, "-c", "import time; time.sleep(120)"]


class StopOnRestart(logging.Handler):
    """Stops the supervisor the moment it says it will restart a child: inside its backoff."""

    def __init__(self, supervisor: Supervisor) -> None:
        super().__init__()
        self.supervisor = supervisor
        self.restarts = 0

    def emit(self, record: logging.LogRecord) -> None:
        if "restarting it" in record.getMessage():
            self.restarts += 1
            self.supervisor._stop(signal.SIGTERM, None)


def test_a_stop_during_a_restart_backoff_exits_0_without_restarting() -> None:
    supervisor = Supervisor(argv=SLEEPER, env=dict(os.environ), count=2, grace_seconds=10)
    handler = StopOnRestart(supervisor)
    logger = logging.getLogger("jobq.supervisor")
    logger.addHandler(handler)
    started = threading.Event()
    killed: list[int] = []

    def kill_one() -> None:
        # The children exist once run() started them; kill the first outright.
        started.wait(10)
        child = supervisor.children[0]
        assert child is not None
        killed.append(child.pid)
        child.send_signal(signal.SIGKILL)

    original_start = supervisor._start

    def start(slot: int) -> None:
        original_start(slot)
        if slot == supervisor.count - 1:
            started.set()

    supervisor._start = start  # type: ignore[method-assign]
    killer = threading.Thread(target=kill_one)
    killer.start()
    try:
        status = supervisor.run()
    finally:
        killer.join(10)
        logger.removeHandler(handler)
        for child in supervisor.children:
            if child is not None and child.poll() is None:
                child.kill()
                child.wait()
    assert killed and handler.restarts == 1
    # The killed child was said and replaced-to-be; the stop ended the other one cleanly.
    assert status == 0
    assert supervisor.children[0] is None, "no new child was started after the stop"
    other = supervisor.children[1]
    assert other is not None and other.returncode == -signal.SIGTERM
