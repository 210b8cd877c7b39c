"""A TCP proxy in front of a real server that breaks connections the way the keep-alive race does.

It forwards bytes both ways and knows no more of HTTP than that a client's bytes after an answer
are its next request on a reused connection. Two ways to break a connection, each for a number of
connections:

- ``drop_reused``: a reused connection is reset the moment its next request arrives, before the
  server sees it: the server's idle timeout firing just as the client sends (the keep-alive race
  at its worst);
- ``drop_answers``: a request is passed on, and the connection is reset when its answer comes
  back, so the server did the work and the client never hears of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from types import TracebackType
from typing import Self

CHUNK_BYTES = 65536


def _reset(writer: asyncio.StreamWriter) -> None:
    """Closes the connection with an RST (SO_LINGER 0), as a kernel does for a closed socket."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class DroppingProxy:
    """Listens on a free port of 127.0.0.1 and forwards each connection to ``upstream_port``."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.drop_reused = 0
        self.drop_answers = 0
        self.connections = 0  # client connections accepted
        self.dropped = 0  # connections reset by either rule
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def url(self) -> str:
        """The proxy's base URL."""
        assert self._server is not None
        port = self._server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def __aenter__(self) -> Self:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()

    async def _accept(
        self, client_in: asyncio.StreamReader, client_out: asyncio.StreamWriter
    ) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self.connections += 1
        try:
            upstream_in, upstream_out = await asyncio.open_connection(
                "127.0.0.1", self.upstream_port
            )
        except OSError:
            _reset(client_out)
            self._tasks.discard(task)
            return
        answered = asyncio.Event()  # an answer went back: the client's next bytes reuse it
        request_sent = asyncio.Event()  # a request went upstream since the last answer

        async def requests() -> None:
            while data := await client_in.read(CHUNK_BYTES):
                if answered.is_set() and not request_sent.is_set() and self.drop_reused > 0:
                    self.drop_reused -= 1
                    raise ConnectionAbortedError
                answered.clear()
                request_sent.set()
                upstream_out.write(data)
                await upstream_out.drain()

        async def answers() -> None:
            while data := await upstream_in.read(CHUNK_BYTES):
                if request_sent.is_set() and not answered.is_set() and self.drop_answers > 0:
                    self.drop_answers -= 1
                    raise ConnectionAbortedError
                request_sent.clear()
                answered.set()
                client_out.write(data)
                await client_out.drain()

        pumps = [asyncio.ensure_future(requests()), asyncio.ensure_future(answers())]
        try:
            done, _ = await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
            if any(
                not p.cancelled() and isinstance(p.exception(), ConnectionAbortedError)
                for p in done
            ):
                self.dropped += 1
                _reset(client_out)
            else:
                client_out.close()
        finally:
            for pump in pumps:
                pump.cancel()
            await asyncio.gather(*pumps, return_exceptions=True)
            upstream_out.close()
            if not client_out.is_closing():
                client_out.close()
            self._tasks.discard(task)
