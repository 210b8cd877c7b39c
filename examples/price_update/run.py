"""Runs the price-list update end to end and measures what a customer-service write waits meanwhile.

    python -m examples.price_update.run                      # 2,000,000 books, embedded PostgreSQL
    python -m examples.price_update.run --rows 200000 --compare-single

1. Creates ``bookstore.books`` (``--rows`` books, version 6) in ``BOOKS_DATABASE_URL``, else
   ``DATABASE_URL``, else an embedded PostgreSQL under ``JOBQ_DATA_DIR`` (default ``.jobq``).
2. Uses the jobq service at ``JOBQ_URL``, or starts ``jobq serve`` on a free port on that database.
3. Enqueues one ``raise_prices`` job and runs the example worker in this process.
4. While the job runs, another connection issues ``UPDATE bookstore.books SET price = price
   WHERE id = 42`` every ``--probe-interval`` seconds and records how long each one took: with
   chunks, a write waits at most for one chunk's transaction.
5. Prints the total time, rows per second and those waits; ``--compare-single`` then rebuilds the
   table and does the same with one ``UPDATE`` of every row, for contrast.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import AsyncIterator, Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import asyncpg
import httpx

from examples.price_update.books import (
    ROWS_DEFAULT,
    TABLE,
    asyncpg_dsn,
    create_books,
    version_counts,
)
from examples.price_update.worker import CHUNK_DEFAULT, JOB_TYPE, QUEUE_DEFAULT, build_worker
from jobq_client import Client

PROBE_SQL = f"UPDATE {TABLE} SET price = price WHERE id = 42"
READY_TIMEOUT_SECONDS = 60.0
JOB_TIMEOUT_SECONDS = 3600.0


class Probe:
    """Times a one-row update from its own connection every ``interval`` seconds until stopped."""

    def __init__(self, dsn: str, interval: float) -> None:
        self.dsn = dsn
        self.interval = interval
        self.waits_ms: list[float] = []
        self._stop = asyncio.Event()

    async def run(self) -> None:
        conn = await asyncpg.connect(self.dsn)
        try:
            while not self._stop.is_set():
                began = time.perf_counter()
                await conn.execute(PROBE_SQL)
                self.waits_ms.append((time.perf_counter() - began) * 1000)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), self.interval)
        finally:
            await conn.close()

    def stop(self) -> None:
        self._stop.set()

    def summary(self) -> str:
        if not self.waits_ms:
            return "no samples"
        waits = sorted(self.waits_ms)
        p99 = waits[min(len(waits) - 1, round(0.99 * (len(waits) - 1)))]
        return (
            f"max {waits[-1]:.1f} ms, p50 {statistics.median(waits):.1f} ms, "
            f"p99 {p99:.1f} ms ({len(waits)} updates of id 42)"
        )


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextlib.contextmanager
def _embedded_postgres() -> Iterator[str]:
    """The embedded PostgreSQL that ``jobq serve`` would use, under ``JOBQ_DATA_DIR``."""
    from app.embedded import start_embedded_postgres

    with warnings.catch_warnings():  # platformdirs warns when XDG_RUNTIME_DIR is unset
        warnings.simplefilter("ignore")
        url = start_embedded_postgres(Path(os.environ.get("JOBQ_DATA_DIR", ".jobq")))
    yield url


def _spawn_service(port: int, database_url: str) -> tuple[subprocess.Popen[bytes], str]:
    """Starts ``jobq serve`` on ``port``; answers the process and the file its output goes to."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBQ_")}
    env["DATABASE_URL"] = database_url
    argv = [sys.executable, "-m", "app.cli", "serve", "--port", str(port), "--log-level", "warning"]
    with tempfile.NamedTemporaryFile(
        "wb", prefix="jobq-serve-", suffix=".log", delete=False
    ) as log:
        process = subprocess.Popen(
            argv, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
        )
    return process, log.name


def _stop_service(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(15)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@contextlib.asynccontextmanager
async def _jobq_service(database_url: str) -> AsyncIterator[str]:
    """``JOBQ_URL`` if set; otherwise a ``jobq serve`` process on ``database_url`` for the run."""
    if os.environ.get("JOBQ_URL"):
        yield os.environ["JOBQ_URL"]
        return
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    process, log_name = _spawn_service(port, database_url)
    try:
        deadline = time.monotonic() + READY_TIMEOUT_SECONDS
        async with httpx.AsyncClient(base_url=url, timeout=2) as http:
            while True:
                if process.poll() is not None:
                    raise SystemExit(f"jobq serve exited with {process.returncode}; see {log_name}")
                with contextlib.suppress(httpx.TransportError):
                    if (await http.get("/readyz")).status_code == 200:
                        break
                if time.monotonic() > deadline:
                    raise SystemExit(f"jobq serve not ready after {READY_TIMEOUT_SECONDS} s")
                await asyncio.sleep(0.1)
        print(f"jobq serve on {url} (log {log_name})")
        yield url
    finally:
        await asyncio.to_thread(_stop_service, process)


async def _setup(dsn: str, rows: int) -> None:
    began = time.perf_counter()
    conn = await asyncpg.connect(dsn)
    try:
        await create_books(conn, rows)
    finally:
        await conn.close()
    print(f"created {TABLE}: {rows:,} books in {time.perf_counter() - began:.1f} s")


async def _chunked(dsn: str, url: str, args: argparse.Namespace) -> dict[str, Any]:
    """Enqueues the job, runs the worker here until the job ends; answers the job."""
    payload = {"percent": args.percent, "to_version": args.to_version, "chunk": args.chunk}
    worker = build_worker(url, books_url=dsn, queues=[args.queue])
    probe = Probe(dsn, args.probe_interval)
    async with Client(url) as client:
        # An unfinished job of an earlier run would be claimed too, and its checkpoint names a
        # position in a table that was rebuilt since: refuse rather than measure a mix.
        for status in ("pending", "scheduled", "running"):
            page = await client.list_jobs(queue=args.queue, status=status, limit=10)
            if page["jobs"]:
                ids = ", ".join(str(j["id"]) for j in page["jobs"])
                raise SystemExit(
                    f"queue {args.queue!r} has {status} jobs from an earlier run ({ids}): "
                    "cancel them (POST /v1/jobs/{id}/cancel) or pass another --queue"
                )
        job = await client.enqueue(JOB_TYPE, payload, queue=args.queue)
        began = time.perf_counter()
        probing = asyncio.create_task(probe.run(), name="probe")
        working = asyncio.create_task(worker.run(), name="worker")
        last_print = 0.0
        try:
            while True:
                job = await client.get_job(job["id"])
                if job["status"] in ("succeeded", "dead", "cancelled"):
                    break
                if working.done():
                    raise SystemExit(f"the worker stopped before the job ended: {job['status']}")
                if time.perf_counter() - began > JOB_TIMEOUT_SECONDS:
                    raise SystemExit("the job did not end in time")
                if job["progress"] and time.perf_counter() - last_print >= 1:
                    last_print = time.perf_counter()
                    progress = job["progress"]
                    print(f"  {progress['done']:>12,} / {progress['total']:,}")
                await asyncio.sleep(0.1)
        finally:
            elapsed = time.perf_counter() - began
            probe.stop()
            worker.stop()
            await asyncio.gather(probing, working)
    if job["status"] != "succeeded":
        raise SystemExit(f"job ended {job['status']}: {job['last_error']}")
    result = job["result"]
    if job["attempts"] != 1:
        print(f"  note: {job['attempts']} attempts, errors {job['errors']}")
    print(
        f"chunked ({args.chunk:,} rows per chunk): {result['rows_updated']:,} rows in "
        f"{result['seconds']:.1f} s in the handler ({result['rows_updated'] / result['seconds']:,.0f}"
        f" rows/s), {elapsed:.1f} s from enqueue to succeeded"
    )
    print(f"  one-row update of id 42 meanwhile: {probe.summary()}")
    return job


async def _single(dsn: str, args: argparse.Namespace) -> None:
    """The same rise as one UPDATE (one transaction), with the same probe, for contrast."""
    factor = 1 + Decimal(args.percent) / 100
    probe = Probe(dsn, args.probe_interval)
    conn = await asyncpg.connect(dsn)
    try:
        began = time.perf_counter()
        updating = asyncio.create_task(
            conn.execute(
                f"UPDATE {TABLE} SET price = round(price * $1::numeric, 2), price_list_version = $2"
                " WHERE price_list_version < $2",
                factor,
                args.to_version,
            )
        )
        # Probe once the statement holds id 42 (it reaches the first page at once). Probing
        # earlier would move row 42's live version to the end of the heap, where the scan
        # comes last, and hide the wait.
        await asyncio.sleep(0.2)
        probing = asyncio.create_task(probe.run(), name="probe")
        status = await updating
        seconds = time.perf_counter() - began
        probe.stop()
        await probing
    finally:
        await conn.close()
    rows = int(status.rsplit(" ", 1)[1])
    print(f"single statement: {rows:,} rows in {seconds:.1f} s ({rows / seconds:,.0f} rows/s)")
    print(f"  one-row update of id 42 meanwhile: {probe.summary()}")


async def _main(args: argparse.Namespace) -> None:
    with contextlib.ExitStack() as stack:
        database_url = os.environ.get("BOOKS_DATABASE_URL") or os.environ.get("DATABASE_URL")
        if not database_url:
            if os.environ.get("JOBQ_URL"):
                raise SystemExit("with JOBQ_URL set, set BOOKS_DATABASE_URL too")
            database_url = stack.enter_context(_embedded_postgres())
        dsn = asyncpg_dsn(database_url)
        conn = await asyncpg.connect(dsn)
        try:
            version = await conn.fetchval("SHOW server_version")
        finally:
            await conn.close()
        print(f"PostgreSQL {version}, {os.cpu_count()} CPUs")
        await _setup(dsn, args.rows)
        async with _jobq_service(database_url) as url:
            await _chunked(dsn, url, args)
        conn = await asyncpg.connect(dsn)
        try:
            counts = await version_counts(conn)
        finally:
            await conn.close()
        print(f"  books per price-list version afterwards: {counts}")
        if counts != {args.to_version: args.rows}:
            raise SystemExit("not every book reached the new version")
        if args.compare_single:
            await _setup(dsn, args.rows)
            await _single(dsn, args)


def main(argv: list[str] | None = None) -> int:
    """Command line of the example."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=ROWS_DEFAULT)
    parser.add_argument("--queue", default=QUEUE_DEFAULT)
    parser.add_argument("--chunk", type=int, default=CHUNK_DEFAULT)
    parser.add_argument("--percent", type=int, default=8)
    parser.add_argument("--to-version", type=int, default=7)
    parser.add_argument("--probe-interval", type=float, default=0.1, help="seconds")
    parser.add_argument(
        "--compare-single", action="store_true", help="then also time one UPDATE of every row"
    )
    asyncio.run(_main(parser.parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
