"""Multi-host URLs: parsed for SQLAlchemy and asyncpg, and a dead first host does not block the next."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import asyncpg
import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url

from app.db import NoUsableHost, async_url, connect_each_host, create_admin_engine, driver_dsn

TWO_HOSTS = "postgresql://jobq:s%40cret@db1:5432,db2:6432/jobq?target_session_attrs=read-write"


def test_multi_host_url_for_sqlalchemy_and_asyncpg() -> None:
    """libpq's host list becomes SQLAlchemy's repeated ``host``; asyncpg's DSN keeps the list."""
    url = async_url(TWO_HOSTS)
    assert url.query["host"] == ("db1:5432", "db2:6432")
    assert url.query["target_session_attrs"] == "read-write"
    _, kwargs = url.get_dialect()().create_connect_args(url)
    assert kwargs["host"] == ["db1", "db2"] and kwargs["port"] == [5432, 6432]
    assert kwargs["password"] == "s@cret" and kwargs["database"] == "jobq"
    assert driver_dsn(TWO_HOSTS) == TWO_HOSTS


def test_multi_host_url_without_ports_and_single_hosts_unchanged() -> None:
    """A host without a port gets 5432 (asyncpg needs every one); one host is left alone."""
    assert async_url("postgres://u@a,b:7/d").query["host"] == ("a:5432", "b:7")
    single = "postgresql://u:p@h:5433/d?sslmode=require"
    assert async_url(single) == make_url(single).set(drivername="postgresql+asyncpg")
    assert driver_dsn(single) == single
    socket_url = "postgresql://postgres:@/postgres?host=/tmp/pg"
    assert async_url(socket_url).query["host"] == "/tmp/pg"


@pytest.fixture
def dead_host() -> Iterator[int]:
    """A port whose listener never accepts: a connection to it hangs, as to a dead machine."""
    with socket.socket() as hole:
        hole.bind(("127.0.0.1", 0))
        hole.listen(1)
        yield hole.getsockname()[1]


async def test_dead_first_host_does_not_block_the_next(pg_server_url: str, dead_host: int) -> None:
    """asyncpg's own host list spends its one timeout on a hung host; connect_each_host moves on."""
    server = async_url(pg_server_url)
    _, args = server.get_dialect()().create_connect_args(server)
    live_host, live_port = args.pop("host", "127.0.0.1"), args.pop("port", 5432)
    hosts, ports = ["127.0.0.1", live_host], [dead_host, live_port]
    with pytest.raises(TimeoutError):
        await asyncpg.connect(host=hosts, port=ports, timeout=1, **args)
    conn = await connect_each_host(host=hosts, port=ports, timeout=1, **args)
    try:
        assert await conn.fetchval("SELECT 1") == 1
    finally:
        await conn.close()
    with pytest.raises(NoUsableHost, match="TimeoutError"):
        await connect_each_host(host=["127.0.0.1"], port=[dead_host], timeout=0.5, **args)


async def test_engines_walk_the_host_list(pg_server_url: str, dead_host: int) -> None:
    """An engine made here on a URL whose first host is dead connects to the second."""
    admin = await asyncpg.connect(driver_dsn(pg_server_url))
    try:
        port = int(await admin.fetchval("SHOW port"))
    finally:
        await admin.close()
    server = make_url(pg_server_url)
    live = server.host or str(server.query["host"])  # a TCP host, or the socket folder
    # SQLAlchemy's form of a host list, which can also hold a socket folder.
    url = (
        f"postgresql://{server.username}@/{server.database}"
        f"?host=127.0.0.1:{dead_host}&host={live}:{port}"
    )
    engine = create_admin_engine(url, connect_timeout=1)
    try:
        async with engine.connect() as conn:
            assert (await conn.execute(text("SELECT 1"))).scalar_one() == 1
    finally:
        await engine.dispose()
