"""What every workload shares: the meter of its timed section, its errors, job numbers, the job's type.

The lowest of bench's modules: it imports none of the others, so the load process
(``bench/load.py``), the HTTP workloads (``bench/workloads.py``, ``bench/composed.py``), the
raw-SQL baselines (``bench/baseline.py``, ``bench/composed_raw.py``) and PGQueuer's
(``bench/peers.py``) all point down to it. :class:`Flows` times composed units end to end.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from bench.procstat import tree_cpu_seconds

JOB_TYPE = "bench"
LEASE_SECONDS = 30

MAX_ERRORS_KEPT = 20


class Meter:
    """Wall time, this process's CPU and the servers' CPU over one timed section."""

    def __init__(self, server_pids: Sequence[int], client_pid: int | None = None) -> None:
        self.server_pids = list(server_pids)
        # The client's CPU is this process's own, or that of the process ``client_pid`` names
        # (a worker in another language that this process drives).
        self.client_pid = client_pid
        self._wall = self._cpu = self._server = 0.0
        self.wall_seconds = self.client_cpu_seconds = self.server_cpu_seconds = 0.0

    def start(self) -> None:
        """Marks the start of the timed section."""
        self._server = tree_cpu_seconds(self.server_pids)
        self._cpu = self._client_cpu()
        self._wall = time.perf_counter()

    def stop(self) -> None:
        """Marks its end."""
        self.wall_seconds = time.perf_counter() - self._wall
        self.client_cpu_seconds = self._client_cpu() - self._cpu
        self.server_cpu_seconds = tree_cpu_seconds(self.server_pids) - self._server

    def _client_cpu(self) -> float:
        if self.client_pid is None:
            return time.process_time()
        return tree_cpu_seconds([self.client_pid])

    def figures(self) -> dict[str, float]:
        """The three measured figures."""
        return {
            "wall_seconds": self.wall_seconds,
            "client_cpu_seconds": self.client_cpu_seconds,
            "server_cpu_seconds": self.server_cpu_seconds,
        }


class Errors:
    """Errors seen during a run: all counted, the first few kept with their text."""

    def __init__(self) -> None:
        self.count = 0
        self.kept: list[str] = []

    def add(self, message: str) -> None:
        """Counts one error and keeps its text while fewer than ``MAX_ERRORS_KEPT`` are kept."""
        self.count += 1
        if len(self.kept) < MAX_ERRORS_KEPT:
            self.kept.append(message[:500])

    def figures(self) -> dict[str, Any]:
        """The count and the kept texts."""
        return {"error_count": self.count, "errors": self.kept}


class Counter:
    """Hands out consecutive numbers below a limit to concurrent clients."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.next = 0

    def take(self, n: int) -> range:
        """Up to ``n`` numbers (empty once the limit is reached)."""
        start = self.next
        self.next = min(self.limit, start + n)
        return range(start, self.next)


Workload = Callable[[dict[str, Any], Meter, Errors], Awaitable[dict[str, Any]]]


class Flows:
    """Units of composed work (a workflow, a batch with its callback) in flight: each one's end.

    A producer sends a unit and waits on :meth:`ended` for the time its last job was completed;
    the worker that completed it calls :meth:`end` with the unit's key. Either may come first:
    a fast worker can finish a unit before its producer has read the answer that names it.
    """

    def __init__(self) -> None:
        self._ends: dict[Any, asyncio.Future[float]] = {}

    def _future(self, key: Any) -> asyncio.Future[float]:
        future = self._ends.get(key)
        if future is None:
            future = self._ends[key] = asyncio.get_running_loop().create_future()
        return future

    def end(self, key: Any) -> bool:
        """Records that unit ``key`` ended now; False when it had ended already (a duplicate)."""
        future = self._future(key)
        if future.done():
            return False
        future.set_result(time.perf_counter())
        return True

    async def ended(self, key: Any, timeout: float) -> float:  # noqa: ASYNC109
        """``perf_counter()`` when unit ``key`` ended; raises ``TimeoutError`` after ``timeout``."""
        return await asyncio.wait_for(asyncio.shield(self._future(key)), timeout)
