"""A real HTTP receiver for webhook tests: an asyncio server on 127.0.0.1 that records each POST.

Deliberately small (HTTP/1.1, one request per connection, Content-Length bodies): jobq's sender
closes every connection after its answer. ``answer`` decides each request's status (and may
wait first, to hold a delivery in flight); the default accepts everything with 200.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Received:
    """One request the receiver got."""

    path: str
    headers: dict[str, str]  # lower-case names
    body: bytes
    status: int  # what it answered

    @property
    def json(self) -> Any:
        """The body as JSON."""
        return json.loads(self.body)

    @property
    def delivery_id(self) -> str:
        """The Jobq-Delivery-Id header."""
        return self.headers["jobq-delivery-id"]


Answer = Callable[["Received", int], Awaitable[int]]


async def accept_all(request: Received, seen_before: int) -> int:
    """Answers 200 to everything."""
    return 200


@dataclass
class Receiver:
    """The server's address and what it received, in order."""

    port: int
    answer: Answer = accept_all
    received: list[Received] = field(default_factory=list)

    def url(self, path: str = "/hook") -> str:
        """A callback URL on this receiver."""
        return f"http://127.0.0.1:{self.port}{path}"

    def accepted(self) -> list[Received]:
        """The requests answered with a 2xx."""
        return [r for r in self.received if 200 <= r.status < 300]

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            _method, path, _version = lines[0].split(" ", 2)
            headers = {}
            for line in lines[1:]:
                if ":" in line:
                    name, _, value = line.partition(":")
                    headers[name.strip().lower()] = value.strip()
            body = await reader.readexactly(int(headers.get("content-length", "0")))
            request = Received(path=path, headers=headers, body=body, status=0)
            seen = sum(
                1
                for r in self.received
                if r.headers.get("jobq-delivery-id") == headers.get("jobq-delivery-id")
            )
            self.received.append(request)
            request.status = await self.answer(request, seen)
            writer.write(
                f"HTTP/1.1 {request.status} X\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok".encode()
            )
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


@asynccontextmanager
async def receiver(answer: Answer = accept_all) -> AsyncIterator[Receiver]:
    """A running receiver on a free port of 127.0.0.1."""
    made = Receiver(port=0, answer=answer)
    server = await asyncio.start_server(made._handle, "127.0.0.1", 0)
    made.port = server.sockets[0].getsockname()[1]
    try:
        yield made
    finally:
        server.close()
        await server.wait_closed()
