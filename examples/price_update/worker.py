"""The price-list job: raise every book's price in keyset chunks, checkpointing after each chunk.

    BOOKS_DATABASE_URL=postgresql://... jobq worker examples.price_update.worker:worker --url http://127.0.0.1:8000

Job type ``raise_prices``, payload ``{"percent": 8, "to_version": 7, "chunk": 20000}`` (optional
``"pause_seconds"``: a pause between chunks that leaves room for other load, or for replicas to
catch up). Each chunk is one short transaction of its own::

    UPDATE bookstore.books SET price = round(price * 1.08, 2), price_list_version = 7
    WHERE id > $1 AND id <= $2 AND price_list_version < 7

after which ``{"last_id": upper}`` is saved as the job's checkpoint (through a heartbeat, under
the lease check). A new attempt starts from ``ctx.checkpoint["last_id"]``.

The chunk's commit and the checkpoint are two transactions in two databases, so they cannot be
atomic. They do not need to be: the order is chunk first, checkpoint second, so the checkpoint
never claims a chunk that was not committed, and a crash between the two only makes the next
attempt redo a chunk whose guard ``price_list_version < 7`` now matches no row. No book is raised
twice, none is skipped.

Settings (environment): ``BOOKS_DATABASE_URL`` (else ``DATABASE_URL``), ``JOBQ_URL`` (the
``jobq worker --url`` option wins), ``PRICE_UPDATE_QUEUE`` (default ``bookstore``),
``PRICE_UPDATE_LEASE_SECONDS`` (default 30), ``PRICE_UPDATE_WORKER_ID`` (default host:pid:random).

The result tells what the attempt did: ``rows_updated``, ``last_id``, ``started_from`` (the
checkpoint it resumed from), ``attempt``, ``chunks``, ``seconds`` and ``idle_before_seconds``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from datetime import datetime
from decimal import Decimal
from typing import Any

import asyncpg

from examples.price_update.books import TABLE, asyncpg_dsn, books_dsn
from jobq_client import JobContext, NonRetryableError, StopRequested, Worker

logger = logging.getLogger("examples.price_update")

JOB_TYPE = "raise_prices"
QUEUE_DEFAULT = "bookstore"
CHUNK_DEFAULT = 20_000

# The next chunk's upper bound: the id `chunk` rows past `last_id` (or the last id), keyset, never
# OFFSET over the table: the primary key index is entered at `last_id` and read for `chunk` rows.
_NEXT_UPPER = f"SELECT max(id) FROM (SELECT id FROM {TABLE} WHERE id > $1 ORDER BY id LIMIT $2) c"
_RAISE_CHUNK = (
    f"UPDATE {TABLE} SET price = round(price * $3::numeric, 2), price_list_version = $4"
    " WHERE id > $1 AND id <= $2 AND price_list_version < $4"
)


def _payload(ctx: JobContext) -> tuple[Decimal, int, int, float]:
    """The job's (factor, to_version, chunk, pause_seconds); a bad payload fails the job for good."""
    payload = ctx.payload
    try:
        percent = Decimal(str(payload["percent"]))
        to_version = int(payload["to_version"])
        chunk = int(payload.get("chunk", CHUNK_DEFAULT))
        pause = float(payload.get("pause_seconds", 0))
    except (TypeError, KeyError, ValueError, ArithmeticError) as exc:
        raise NonRetryableError(f"bad payload {payload!r}: {exc!r}") from exc
    if not (chunk >= 1 and pause >= 0 and percent.is_finite()):
        raise NonRetryableError(f"bad payload {payload!r}")
    return 1 + percent / 100, to_version, chunk, pause


async def raise_prices(ctx: JobContext, *, dsn: str) -> dict[str, Any]:
    """Raises prices chunk by chunk from the checkpoint on; answers what this attempt did."""
    factor, to_version, chunk, pause = _payload(ctx)
    checkpoint = ctx.checkpoint if isinstance(ctx.checkpoint, dict) else {}
    started_from = int(checkpoint.get("last_id", 0))
    began = time.monotonic()
    logger.info(
        "job %s attempt %s: raising prices by factor %s to version %s from id %s",
        ctx.job_id,
        ctx.attempt,
        factor,
        to_version,
        started_from,
    )
    rows_updated = chunks = 0
    last_id = started_from
    conn = await asyncpg.connect(dsn)
    try:
        total = await conn.fetchval(f"SELECT max(id) FROM {TABLE}") or 0
        while True:
            if ctx.stopping:
                # Shutting down between chunks: saving the checkpoint hands the job back now.
                await _save(ctx, last_id, total)
            upper = await conn.fetchval(_NEXT_UPPER, last_id, chunk)
            if upper is None:
                break
            # One statement outside a transaction block: its own short transaction, committed
            # before the checkpoint names it.
            status = await conn.execute(_RAISE_CHUNK, last_id, upper, factor, to_version)
            rows_updated += int(status.rsplit(" ", 1)[1])
            chunks += 1
            last_id = upper
            await _save(ctx, last_id, total)
            if pause:
                await asyncio.sleep(pause)
    except StopRequested:
        logger.info("job %s: stopped at id %s, checkpoint saved", ctx.job_id, last_id)
        raise
    finally:
        await conn.close()
    seconds = time.monotonic() - began
    logger.info(
        "job %s attempt %s: %d rows in %d chunks, ids %s..%s, %.1f s",
        ctx.job_id,
        ctx.attempt,
        rows_updated,
        chunks,
        started_from,
        last_id,
        seconds,
    )
    return {
        "rows_updated": rows_updated,
        "last_id": last_id,
        "started_from": started_from,
        "attempt": ctx.attempt,
        "chunks": chunks,
        "seconds": round(seconds, 3),
        "idle_before_seconds": _idle_before(ctx),
    }


async def _save(ctx: JobContext, last_id: int, total: int) -> None:
    """Saves the checkpoint; raises ``StopRequested`` after saving when the worker is stopping."""
    await ctx.save_checkpoint({"last_id": last_id}, progress={"done": last_id, "total": total})


def _idle_before(ctx: JobContext) -> float | None:
    """Seconds from the checkpoint this attempt resumed from to its claim, by the service's clock.

    ``checkpoint_at`` is stamped by the last save or by the release, ``started_at`` by the claim:
    about a lease after a crash, next to nothing after a graceful release.
    """
    saved, claimed = ctx.job.get("checkpoint_at"), ctx.job.get("started_at")
    if not (ctx.checkpoint and saved and claimed):
        return None
    gap = datetime.fromisoformat(claimed) - datetime.fromisoformat(saved)
    return round(gap.total_seconds(), 3)


def build_worker(
    base_url: str | None = None, *, books_url: str | None = None, **options: Any
) -> Worker:
    """A Worker for the ``raise_prices`` jobs of the bookstore queue, one job at a time.

    ``books_url`` is the books database (default: :func:`books_dsn` when a job starts);
    ``options`` go to :class:`Worker` over the defaults here.
    """
    settings: dict[str, Any] = {
        "queues": [os.environ.get("PRICE_UPDATE_QUEUE", QUEUE_DEFAULT)],
        "concurrency": 1,
        "lease_seconds": int(os.environ.get("PRICE_UPDATE_LEASE_SECONDS", "30")),
        "worker_id": os.environ.get("PRICE_UPDATE_WORKER_ID") or None,
        **options,
    }
    w = Worker(base_url or os.environ.get("JOBQ_URL", "http://127.0.0.1:8000"), **settings)

    @w.handler(JOB_TYPE)
    async def handle(ctx: JobContext) -> dict[str, Any]:
        return await raise_prices(ctx, dsn=asyncpg_dsn(books_url) if books_url else books_dsn())

    return w


worker = build_worker()
