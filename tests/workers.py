"""A jobq_client worker running in the background for the span of a test block."""

from __future__ import annotations

import asyncio

from jobq_client import Worker


class RunningWorker:
    """A worker's ``run()`` in a task for the span of an ``async with``; stopped and awaited after."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> RunningWorker:
        self.task = asyncio.create_task(
            self.worker.run(install_signal_handlers=False), name=f"run-{self.worker.worker_id}"
        )
        return self

    async def stop(self, within: float = 10.0) -> None:
        """Asks for a graceful stop and waits for ``run()`` to return."""
        assert self.task is not None
        self.worker.stop()
        await asyncio.wait_for(asyncio.shield(self.task), within)

    async def __aexit__(self, *exc: object) -> None:
        assert self.task is not None
        if not self.task.done():
            self.worker.stop()
            self.worker.stop()  # the test is over: no grace period
        await asyncio.wait_for(self.task, 15)
