"""The contract suite's driver for ``jobq_client`` (clients/CONTRACT.md): its public API, nothing else.

``python tests/contract/python_driver.py enqueue '{"type": ...}'`` | ``workflow '{"name": ...}'``
| ``wait ID SECONDS`` | ``worker``.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any

from jobq_client import Client, JobContext, JobqError, Step, WaitTimeout, Worker


def emit(line: dict[str, Any]) -> None:
    """One JSON line on stdout, flushed at once: the suite reads it while the process runs."""
    print(json.dumps(line), flush=True)


def env_float(name: str, default: float) -> float:
    value = os.environ.get(name)
    return float(value) if value else default


def client() -> Client:
    return Client(os.environ["JOBQ_URL"], api_key=os.environ.get("JOBQ_API_KEY") or None)


async def enqueue(spec: dict[str, Any]) -> None:
    async with client() as producer:
        try:
            job = await producer.enqueue(
                spec["type"],
                spec.get("payload"),
                queue=os.environ["JOBQ_QUEUE"],
                idempotency_key=spec.get("idempotency_key"),
                max_attempts=spec.get("max_attempts"),
            )
        except JobqError as exc:
            emit({"ok": False, "status": exc.status, "problem": exc.problem})
            return
    emit({"ok": True, "job": job})


async def workflow(spec: dict[str, Any]) -> None:
    queue = os.environ["JOBQ_QUEUE"]
    async with client() as producer:
        try:
            created = await producer.workflow(
                spec["name"],
                [
                    Step(
                        step["name"],
                        step["type"],
                        after=step.get("after", ()),
                        payload=step.get("payload"),
                        queue=queue,
                    )
                    for step in spec["steps"]
                ],
                idempotency_key=spec.get("idempotency_key"),
            )
        except JobqError as exc:
            emit({"ok": False, "status": exc.status, "problem": exc.problem})
            return
    emit({"ok": True, "workflow": created})


async def wait(job_id: int, seconds: float) -> None:
    async with client() as reader:
        try:
            job = await reader.wait(job_id, timeout=seconds)
        except WaitTimeout:
            emit({"ok": False, "timeout": True})
            return
    emit({"ok": True, "job": job})


class ContractBoom(Exception):
    """The error the ``boom`` handler raises: its type name is what the suite looks for."""


def build_worker() -> Worker:
    lease = int(env_float("JOBQ_LEASE_SECONDS", 30))
    worker = Worker(
        os.environ["JOBQ_URL"],
        api_key=os.environ.get("JOBQ_API_KEY") or None,
        queues=[os.environ["JOBQ_QUEUE"]],
        worker_id=os.environ["JOBQ_WORKER_ID"],
        concurrency=int(env_float("JOBQ_CONCURRENCY", 1)),
        lease_seconds=lease,
        heartbeat_interval=env_float("JOBQ_HEARTBEAT_SECONDS", lease / 3),
        grace_seconds=env_float("JOBQ_GRACE_SECONDS", 10),
        wait_seconds=env_float("JOBQ_WAIT_SECONDS", 2),
    )

    def started(ctx: JobContext) -> None:
        emit(
            {
                "event": "started",
                "job_id": ctx.job_id,
                "type": ctx.type,
                "attempt": ctx.attempt,
                "checkpoint": ctx.checkpoint,
            }
        )

    @worker.handler("echo")
    async def echo(ctx: JobContext) -> Any:
        started(ctx)
        return {"echo": ctx.payload}

    @worker.handler("noop")
    async def noop(ctx: JobContext) -> Any:
        started(ctx)
        return None

    @worker.handler("sleep1ms")
    async def sleep1ms(ctx: JobContext) -> Any:
        started(ctx)
        await asyncio.sleep(0.001)
        return None

    @worker.handler("boom")
    async def boom(ctx: JobContext) -> Any:
        started(ctx)
        raise ContractBoom(ctx.payload["message"])

    @worker.handler("chunked")
    async def chunked(ctx: JobContext) -> Any:
        started(ctx)
        total: int = ctx.payload["chunks"]
        start: int = (ctx.checkpoint or {}).get("next", 0)
        try:
            for n in range(start, total):
                await asyncio.sleep(ctx.payload["chunk_seconds"])
                await ctx.save_checkpoint({"next": n + 1}, progress={"done": n + 1, "total": total})
        except asyncio.CancelledError:
            emit({"event": "aborted", "job_id": ctx.job_id})
            raise
        return {"chunks": total, "resumed_from": start}

    @worker.handler("hang")
    async def hang(ctx: JobContext) -> Any:
        started(ctx)
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:  # jobq_client aborts a handler by cancelling its task
            emit({"event": "aborted", "job_id": ctx.job_id})
            raise

    return worker


async def work() -> None:
    worker = build_worker()
    emit({"event": "ready"})
    await worker.run()  # until SIGTERM / SIGINT, then the graceful stop
    emit({"event": "stopped"})


def main(argv: list[str]) -> None:
    command = argv[1]
    if command == "enqueue":
        asyncio.run(enqueue(json.loads(argv[2])))
    elif command == "workflow":
        asyncio.run(workflow(json.loads(argv[2])))
    elif command == "wait":
        asyncio.run(wait(int(argv[2]), float(argv[3])))
    elif command == "worker":
        asyncio.run(work())
    else:
        sys.exit(f"unknown command {command!r}")


if __name__ == "__main__":
    main(sys.argv)
