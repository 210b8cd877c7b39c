"""A lean HTTP/1.1 keep-alive client on raw asyncio streams, for generating load on `jobq serve`.

One :class:`Connection` is one TCP connection, used by one simulated client at a time: it writes
a request with ``Content-Length``, reads the status line, the headers and a ``Content-Length`` (or
chunked) body, and keeps the connection open for the next request. JSON goes through orjson when
it is installed, else the standard library. It exists because httpx costs about 1.3 ms of CPU
per request on this machine, which would make the benchmark's client its bottleneck.

    conn = Connection("http://127.0.0.1:8000", headers={"Authorization": "Bearer jobq_1_..."})
    response = await conn.post("/v1/jobs", {"queue": "q", "type": "t"})
    response.status, response.json()
    await conn.close()

Used by ``python -m bench.load`` (see ``bench/workloads.py``); not a general-purpose client: no
TLS, no redirects, no proxies, no pipelining.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

try:
    import orjson

    def dumps(value: Any) -> bytes:
        """JSON bytes of ``value`` (orjson)."""
        return orjson.dumps(value)

    loads: Callable[[bytes], Any] = orjson.loads
except ImportError:  # pragma: no cover - depends on what is installed
    import json

    def dumps(value: Any) -> bytes:
        """JSON bytes of ``value`` (standard library, compact)."""
        return json.dumps(value, separators=(",", ":")).encode()

    loads = json.loads

# uvicorn closes a keep-alive connection idle for 5 s; reconnect before it might have.
IDLE_RECONNECT_SECONDS = 4.0
TIMEOUT_SECONDS = 60.0


class HttpError(Exception):
    """The connection broke or the server answered something this client cannot read."""


@dataclass(frozen=True, slots=True)
class Response:
    """One answer: status code, lower-cased headers and the body bytes."""

    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        """The body parsed as JSON."""
        return loads(self.body)


class Connection:
    """One keep-alive HTTP/1.1 connection to ``base_url``; opened on first use, reopened when needed.

    ``headers`` (an ``Authorization`` header, say) go with every request; they are encoded once
    here, so they cost a request nothing but their bytes.
    """

    def __init__(
        self,
        base_url: str,
        *,
        timeout: float = TIMEOUT_SECONDS,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        parts = urlsplit(base_url)
        if parts.scheme != "http" or parts.hostname is None:
            raise ValueError(f"only http://host:port URLs: {base_url!r}")
        self.host = parts.hostname
        self.port = parts.port or 80
        self.timeout = timeout
        fixed = [f"Host: {self.host}:{self.port}\r\n"]
        for name, value in (headers or {}).items():
            if any(c in name + value for c in "\r\n") or not name or ":" in name:
                raise ValueError(f"unusable header {name!r}")
            fixed.append(f"{name}: {value}\r\n")
        self._fixed_headers = "".join(fixed).encode("latin-1")
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._last_used = 0.0

    async def post(self, path: str, payload: Any, *, time_limit: float | None = None) -> Response:
        """``POST path`` with ``payload`` as a JSON body."""
        return await self.request("POST", path, dumps(payload), time_limit=time_limit)

    async def get(self, path: str, *, time_limit: float | None = None) -> Response:
        """``GET path``."""
        return await self.request("GET", path, None, time_limit=time_limit)

    async def request(
        self, method: str, path: str, body: bytes | None, *, time_limit: float | None = None
    ) -> Response:
        """Sends one request and reads its whole answer; raises :class:`HttpError` if it breaks."""
        if self._writer is None or time.monotonic() - self._last_used > IDLE_RECONNECT_SECONDS:
            await self._reconnect()
        assert self._reader is not None and self._writer is not None
        head = b"%s %s HTTP/1.1\r\n" % (method.encode(), path.encode()) + self._fixed_headers
        if body is not None:
            head += b"Content-Type: application/json\r\nContent-Length: %d\r\n" % len(body)
        try:
            async with asyncio.timeout(self.timeout if time_limit is None else time_limit):
                self._writer.write(head + b"\r\n" + body if body is not None else head + b"\r\n")
                if body is not None and len(body) > 65536:
                    await self._writer.drain()
                response = await self._read_response(self._reader)
        except (
            OSError,
            TimeoutError,
            asyncio.IncompleteReadError,
            asyncio.LimitOverrunError,
        ) as exc:
            await self.close()
            raise HttpError(f"{method} {path}: {type(exc).__name__}: {exc}") from exc
        self._last_used = time.monotonic()
        if response.headers.get("connection", "").lower() == "close":
            await self.close()
        return response

    async def close(self) -> None:
        """Closes the connection (the next request opens a new one)."""
        writer, self._reader, self._writer = self._writer, None, None
        if writer is not None:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    async def _reconnect(self) -> None:
        await self.close()
        try:
            async with asyncio.timeout(self.timeout):
                self._reader, self._writer = await asyncio.open_connection(self.host, self.port)
        except (OSError, TimeoutError) as exc:
            raise HttpError(f"connect {self.host}:{self.port}: {exc}") from exc

    @staticmethod
    async def _read_response(reader: asyncio.StreamReader) -> Response:
        block = await reader.readuntil(b"\r\n\r\n")
        lines = block[:-4].split(b"\r\n")
        status_line = lines[0].split(b" ", 2)
        if len(status_line) < 2 or not status_line[0].startswith(b"HTTP/1."):
            raise HttpError(f"bad status line: {lines[0]!r}")
        status = int(status_line[1])
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            headers[name.strip().lower().decode("latin-1")] = value.strip().decode("latin-1")
        if "content-length" in headers:
            body = await reader.readexactly(int(headers["content-length"]))
        elif headers.get("transfer-encoding", "").lower() == "chunked":
            body = await Connection._read_chunked(reader)
        elif status in (204, 304) or 100 <= status < 200:
            body = b""
        else:
            raise HttpError(f"answer {status} has neither Content-Length nor chunked encoding")
        return Response(status, headers, body)

    @staticmethod
    async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
        parts: list[bytes] = []
        while True:
            size_line = await reader.readuntil(b"\r\n")
            size = int(size_line.split(b";", 1)[0].strip(), 16)
            if size == 0:
                # Trailers, if any, end with an empty line.
                while (await reader.readuntil(b"\r\n")) != b"\r\n":
                    pass
                return b"".join(parts)
            parts.append(await reader.readexactly(size))
            await reader.readexactly(2)
