"""``jobq serve`` keeps idle connections open longer than clients and proxies keep theirs.

uvicorn's own default closes an idle connection after 5 s: httpx's pool expiry exactly, and well
under nginx's 60 s upstream keep-alive, so a request sent on a pooled connection as the server
closes it is reset. JOBQ_HTTP_KEEPALIVE_SECONDS (75 s by default) must reach uvicorn.
"""

from __future__ import annotations

import asyncio

from sqlalchemy.ext.asyncio import AsyncEngine

from tests.polling import poll_until
from tests.processes import JobqServers

# Longer than uvicorn's default of 5 s and httpx's pool expiry of 5 s.
IDLE_SECONDS = 6.0


async def read_answer(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    """One HTTP/1.1 answer with a Content-Length: its status and body."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    length = next(
        int(line.split(":", 1)[1]) for line in lines if line.lower().startswith("content-length:")
    )
    body = await asyncio.wait_for(reader.readexactly(length), 10)
    return status, body


async def test_an_idle_connection_stays_open_past_five_seconds(
    jobq_servers: JobqServers, clean_db: AsyncEngine
) -> None:
    server = await jobq_servers.start()
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    request = b"GET /healthz HTTP/1.1\r\nHost: jobq\r\n\r\n"
    try:
        writer.write(request)
        assert (await read_answer(reader))[0] == 200
        # Nothing may come while the connection idles: a server that closes it sends EOF here.
        try:
            early = await asyncio.wait_for(reader.read(1), IDLE_SECONDS)
        except TimeoutError:
            early = None
        assert early is None, "the server closed the idle connection"
        writer.write(request)
        status, body = await read_answer(reader)
        assert status == 200 and b"ok" in body
    finally:
        writer.close()


async def test_the_keepalive_setting_reaches_the_server(
    jobq_servers: JobqServers, clean_db: AsyncEngine
) -> None:
    server = await jobq_servers.start(env={"JOBQ_HTTP_KEEPALIVE_SECONDS": "1"})
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    try:
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: jobq\r\n\r\n")
        assert (await read_answer(reader))[0] == 200
        # Closed after about 1 s of idleness, well before uvicorn's own 5 s.
        assert await asyncio.wait_for(reader.read(1), 3.5) == b""
    finally:
        writer.close()


async def test_a_client_that_leaves_mid_body_is_no_server_error(
    jobq_servers: JobqServers, clean_db: AsyncEngine
) -> None:
    # The lean routes read their body themselves (POST /v1/jobs, /v1/claim); FastAPI reads the
    # others' (POST /v1/workflows). A client gone before its body arrived is 499, never a 500.
    server = await jobq_servers.start(env={"JOBQ_LOG_ACCESS": "all"})
    for path in ("/v1/jobs", "/v1/claim", "/v1/workflows"):
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(
            f"POST {path} HTTP/1.1\r\nHost: jobq\r\nContent-Type: application/json\r\n"
            'Content-Length: 1000\r\n\r\n{"queue": "a"'.encode()
        )
        await writer.drain()
        writer.close()
        await writer.wait_closed()
    await poll_until(
        lambda: server.log_text().count('"status_code":499') == 3,
        within=20,
        what="three 499s in the access log",
    )
    log = server.log_text()
    assert "unhandled error" not in log and '"status_code":500' not in log, log[-2000:]
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    try:
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: jobq\r\n\r\n")
        assert (await read_answer(reader))[0] == 200, "the server still answers"
    finally:
        writer.close()
