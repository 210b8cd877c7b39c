"""The HTTP round trip's floor: one sequential client against an app that does nothing.

    python -m bench.http_floor [--requests 3000] [--rounds 5]

Starts uvicorn as ``jobq serve`` runs it (uvloop, httptools, no access log) on this module's
``app``, an ASGI app that reads the request and answers a fixed 201 with a small JSON body, and
posts an enqueue-sized JSON body to it, one request at a time, through the bench's own client
(``bench/http.py``). It prints the median requests/s over the rounds and the time a round trip
takes: what any HTTP service pays per request on this machine before it does any work. Issue
22 compares it with PGQueuer's in-process enqueue (see docs/benchmarks.md). Speed is reported, never
asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

from bench.http import Connection, HttpError

BODY = {"queue": "bench", "type": "bench", "payload": {"n": 1}}
ANSWER = b'{"id":1,"queue":"bench","type":"bench","status":"pending"}'


async def app(
    scope: dict[str, Any],
    receive: Callable[[], Awaitable[dict[str, Any]]],
    send: Callable[[dict[str, Any]], Awaitable[None]],
) -> None:
    """Reads the request, answers 201 with ``ANSWER``; nothing else."""
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):
        pass
    headers = [(b"content-type", b"application/json")]
    await send({"type": "http.response.start", "status": 201, "headers": headers})
    await send({"type": "http.response.body", "body": ANSWER})


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def _ready(url: str, deadline: float) -> Connection:
    while True:
        conn = Connection(url)
        try:
            await conn.post("/", BODY)
            return conn
        except HttpError:
            await conn.close()
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)  # a poll with a deadline: the server sends no event


async def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=3000, help="requests per round")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    port = _free_port()
    command = [sys.executable, "-m", "uvicorn", "bench.http_floor:app", "--port", str(port)]
    command += ["--loop", "uvloop", "--http", "httptools", "--log-level", "warning"]
    server = subprocess.Popen([*command, "--no-access-log"])  # noqa: ASYNC220 - set-up
    try:
        conn = await _ready(f"http://127.0.0.1:{port}", time.monotonic() + 30)
        for _ in range(500):  # warm up
            await conn.post("/", BODY)
        rates = []
        for _ in range(args.rounds):
            started = time.perf_counter()
            for _ in range(args.requests):
                await conn.post("/", BODY)
            rates.append(args.requests / (time.perf_counter() - started))
        await conn.close()
    finally:
        server.terminate()
        server.wait()
    median = statistics.median(rates)
    print(
        f"no-op ASGI app under uvicorn, 1 sequential client: {median:,.0f} requests/s "
        f"({1e3 / median:.3f} ms a round trip); rounds: {', '.join(f'{r:,.0f}' for r in rates)}"
    )


if __name__ == "__main__":
    asyncio.run(main())
