"""Engine and driver-pool factories and URL handling; every connection to PostgreSQL is made here.

Two pools: the SQLAlchemy engine (reads, ops actions, maintenance, migrations) and an asyncpg
pool for the statements on the hot path (enqueue, claim, lease calls), which run prepared on the
driver with its statement cache and none of SQLAlchemy's per-call machinery (why:
docs/adr/0002-hot-path-on-the-driver-pool.md). Both connect as ``application_name = 'jobq'``.

Behind a transaction-mode pooler both pools run with their statement caches off
(``statement_cache=False``), and the control connection takes the direct URL. A URL may list
several hosts (libpq's ``//h1:p1,h2:p2/db?target_session_attrs=read-write``); every factory here
then tries them one by one, each with its own connect timeout, so a failover to a promoted
standby needs no restart.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any
from urllib.parse import quote

import asyncpg
from sqlalchemy import MetaData, event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import NullPool

from app.stored_json import read_json

# No statement jobq runs is long enough for JIT compilation to pay for itself (see _jit_off).
JIT_OFF = "SET jit = off"

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

metadata = MetaData(naming_convention=NAMING_CONVENTION)

CONTROL_STATEMENT_TIMEOUT_SECONDS = 5.0


def _hosts_in_query(url: str) -> str:
    """Moves a libpq multi-host list (``//h1:p1,h2:p2/db``) into ``?host=h1:p1&host=h2:p2``.

    libpq, psql and asyncpg take several hosts in the authority part; SQLAlchemy's URL parser
    does not (it reads the port as ``p1,h2:p2``) but its asyncpg dialect takes them as repeated
    ``host`` query parameters, each with its port. A single host is left as it is.
    """
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    authority, slash, tail = rest.partition("/")
    userinfo, at, hostlist = authority.rpartition("@")
    if "," not in hostlist:
        return url
    hosts = []
    for host in hostlist.split(","):
        if not host or host.startswith(":"):
            raise ValueError(f"a multi-host URL needs a host in every entry, got {hostlist!r}")
        # IPv6 literals keep their brackets; every entry needs its port (asyncpg has none).
        if not re.search(r":\d+$", host.rsplit("]", 1)[-1]):
            host = f"{host}:5432"
        hosts.append(f"host={quote(host, safe='[]:')}")
    path, _, query = tail.partition("?")
    joined = "&".join([*hosts, *([query] if query else [])])
    return f"{scheme}://{userinfo}{at}{slash or '/'}{path}?{joined}"


def async_url(url: str) -> URL:
    """Turns any PostgreSQL URL (``postgres://``, ``postgresql://``, ``+psycopg``) into an asyncpg one.

    A libpq multi-host URL (``postgresql://h1:5432,h2:5432/db?target_session_attrs=read-write``)
    becomes SQLAlchemy's form of it. The factories below then try the hosts in order and keep
    the first that matches ``target_session_attrs`` (:func:`connect_each_host`), which is how
    jobq finds the new primary after a failover.
    """
    parsed = make_url(_hosts_in_query(url.replace("postgres://", "postgresql://", 1)))
    if parsed.get_backend_name() != "postgresql":
        raise ValueError(f"jobq needs a PostgreSQL URL, got backend {parsed.get_backend_name()!r}")
    return parsed.set(drivername="postgresql+asyncpg")


class NoUsableHost(ConnectionError):
    """None of the listed hosts took a session: each refused, timed out, or was not the primary."""


async def connect_each_host(
    *args: Any, host: Sequence[str], port: Sequence[int], **kwargs: Any
) -> Any:
    """``asyncpg.connect`` to the first listed host that takes a session, each on its own timeout.

    asyncpg walks a host list itself, but under one overall ``timeout``: a host that hangs (its
    machine down, a network cut: no refusal ever comes) uses all of it and the next host is never
    tried, so jobq would never reach the promoted standby. Here ``timeout`` is per host.
    """
    errors: list[str] = []
    for one_host, one_port in zip(host, port, strict=True):
        try:
            return await asyncpg.connect(*args, host=one_host, port=one_port, **kwargs)
        except (
            OSError,  # refused, unreachable, timed out
            asyncpg.exceptions.TargetServerAttributeNotMatched,  # a standby, for read-write
            asyncpg.exceptions.CannotConnectNowError,  # starting up, shutting down, recovering
        ) as exc:
            errors.append(f"{one_host}:{one_port}: {type(exc).__name__}: {exc}")
    raise NoUsableHost("no listed host took a session: " + "; ".join(errors))


def _multi_host_args(url: str) -> dict[str, Any] | None:
    """asyncpg ``connect()`` arguments of a URL listing several hosts; ``None`` for one host."""
    parsed = async_url(url)
    hosts = parsed.query.get("host")
    if not isinstance(hosts, tuple) or len(hosts) < 2:
        return None
    _, kwargs = parsed.get_dialect()().create_connect_args(parsed)
    return dict(kwargs)


def _timeout_args(connect_timeout: float | None) -> dict[str, Any]:
    return {} if connect_timeout is None else {"timeout": connect_timeout}


def _unnamed_statement() -> str:
    """The name SQLAlchemy gives each statement it prepares when its cache is off: none.

    PostgreSQL keeps an unnamed statement only until the next one is parsed on the session, so
    no name collides on a server connection a pooler hands to several clients, and none is left
    behind to leak (asyncpg sends Parse, Describe and Flush, then Bind, Execute and Sync: the
    pair runs on one server connection even outside a transaction).
    """
    return ""


def statement_cache_args(statement_cache: bool) -> dict[str, Any]:
    """asyncpg ``connect()`` arguments for the statement cache being on or off.

    Off is for a pooler in transaction mode (PgBouncer before 1.21, or with
    ``max_prepared_statements = 0``): a prepared statement lives on one server session, and the
    next transaction of the same client may run on another one.
    """
    if statement_cache:
        return {}
    return {"statement_cache_size": 0}


def create_engine(
    url: str,
    *,
    pool_size: int,
    max_overflow: int,
    pool_timeout: float,
    statement_cache: bool = True,
    connect_timeout: float | None = None,
) -> AsyncEngine:
    """Creates the async engine the service and its loops share.

    A fixed pool (no overflow) makes requests queue for a connection instead of opening and
    closing overflow connections under load, which was measured to cost more than the work.
    There is no pre-ping (a round trip on every checkout): a connection found dead fails its
    request with a 503 and SQLAlchemy invalidates the pool, so the next requests reconnect
    (after a failover, to whichever listed host is now the primary).

    ``statement_cache=False`` turns off both SQLAlchemy's cache of prepared statements and
    asyncpg's own (used by its catalogue lookups), and prepares every statement unnamed.
    ``connect_timeout`` bounds each connection attempt (per host when the URL lists several);
    ``None`` keeps asyncpg's 60 s.
    """
    connect_args: dict[str, Any] = {
        # Each pooled connection identifies itself in pg_stat_activity.
        "server_settings": {"application_name": "jobq"},
        **statement_cache_args(statement_cache),
        **_connect_args(url, connect_timeout),
    }
    if not statement_cache:
        connect_args["prepared_statement_cache_size"] = 0
        connect_args["prepared_statement_name_func"] = _unnamed_statement
    engine = create_async_engine(
        async_url(url),
        pool_size=pool_size,
        max_overflow=max_overflow,
        pool_timeout=pool_timeout,
        connect_args=connect_args,
        # Row by row: one value no reader takes must not fail the read of every other row.
        json_deserializer=read_json,
    )
    if statement_cache:
        # As on the hot pool, and like it not through a transaction-mode pooler, where a SET
        # would outlive this client on the server session (docs/deploying/production.md, PgBouncer, says what to do
        # there; the service warns at start when JIT is on).
        event.listen(engine.sync_engine, "connect", _jit_off)
    return engine


async def jit_compiles(engine: AsyncEngine) -> bool:
    """Whether this engine's sessions may JIT-compile (JIT available and ``jit`` on): what a
    transaction-mode pooler leaves, where jobq does not SET it itself."""
    async with engine.connect() as conn:
        result = await conn.exec_driver_sql(
            "SELECT pg_jit_available() AND current_setting('jit')::boolean"
        )
        return bool(result.scalar())


def _jit_off(dbapi_connection: Any, _record: Any) -> None:
    """Turns JIT off on a new engine connection.

    The engine's reads are short too, but their estimates are not: ``GET /v1/queues`` (also
    the metrics refresh, every 10 s on every instance) passed ``jit_above_cost`` on a database
    of 40,000 jobs and compiled for 440 ms of a statement that ran in 1 ms (PostgreSQL 15).
    """
    dbapi_connection.run_async(lambda conn: conn.execute(JIT_OFF))


def _connect_args(url: str, connect_timeout: float | None) -> dict[str, Any]:
    """SQLAlchemy ``connect_args`` that bound connection attempts, host by host."""
    args = _timeout_args(connect_timeout)
    if _multi_host_args(url) is not None:
        # The dialect hands its parsed arguments (host and port lists) to this instead of
        # asyncpg.connect.
        args["async_creator_fn"] = connect_each_host
    return args


def create_control_engine(url: str, *, connect_timeout: float | None = None) -> AsyncEngine:
    """An engine without a pool for the control connection (LISTEN, NOTIFY, the leader lock).

    It must reach the server itself, not a pooler in transaction mode: LISTEN and a session
    advisory lock belong to a server session, which such a pooler hands to other clients
    between transactions.
    """
    return create_async_engine(
        async_url(url),
        poolclass=NullPool,
        connect_args={
            "server_settings": {"application_name": "jobq-control"},
            # Its statements are instant; one that hangs means a server gone without a word
            # (a host down, a network cut): fail it, so the channel reconnects elsewhere.
            "command_timeout": CONTROL_STATEMENT_TIMEOUT_SECONDS,
            **_connect_args(url, connect_timeout),
        },
    )


def create_admin_engine(url: str, *, connect_timeout: float | None = None) -> AsyncEngine:
    """An engine without a pool for one-off work (migrations, CLI commands).

    Give it the direct URL when DATABASE_URL goes through a transaction-mode pooler: it keeps
    SQLAlchemy's and asyncpg's statement caches, and a migration's advisory lock is its own.
    A host list is walked host by host, as the service's pools do.
    """
    return create_async_engine(
        async_url(url),
        poolclass=NullPool,
        connect_args={
            "server_settings": {"application_name": "jobq-admin"},
            **_connect_args(url, connect_timeout),
        },
    )


def driver_dsn(url: str) -> str:
    """The same server as a DSN asyncpg itself takes (no SQLAlchemy driver suffix).

    Several hosts go back into the authority part (``//h1:p1,h2:p2/``), where asyncpg reads them.
    """
    parsed = async_url(url).set(drivername="postgresql")
    hosts = parsed.query.get("host")
    if not isinstance(hosts, tuple) or len(hosts) < 2:
        return parsed.render_as_string(hide_password=False)
    rendered = parsed.difference_update_query(["host"]).render_as_string(hide_password=False)
    scheme, _, rest = rendered.partition("://")
    userinfo, at, tail = rest.rpartition("@") if "@" in rest.split("/", 1)[0] else ("", "", rest)
    return f"{scheme}://{userinfo}{at}{','.join(hosts)}{tail}"


def _encode_jsonb(value: bytes | str) -> bytes:
    # Parameters arrive as JSON text already (app.store.conn.to_json); jsonb's binary
    # format is a version byte, then that text.
    return b"\x01" + (value if isinstance(value, bytes) else value.encode())


def _decode_jsonb(data: bytes) -> Any:
    # jsonb's binary format is a version byte, then the text; a value no reader takes comes
    # back as UnreadableJson instead of failing the whole statement (app/stored_json.py).
    return read_json(data[1:])


async def _setup_connection(conn: Any) -> None:
    await conn.set_type_codec(
        "jsonb", schema="pg_catalog", encoder=_encode_jsonb, decoder=_decode_jsonb, format="binary"
    )


async def _setup_generic_plans(conn: Any) -> None:
    """As :func:`_setup_connection`, and the hot statements keep one generic plan each.

    PostgreSQL's default plans a prepared statement again on every call while that plan looks
    cheaper than the generic one, and for the claim it always did: measured, planning took
    about 1 ms of a one-job claim that ran in 0.8 ms (issue 22). Every statement the hot pool
    runs is written so that its generic plan walks the same indexes
    (tests/integration/test_generic_plans.py checks each one on a long history and on a
    backlog).
    """
    await _setup_connection(conn)
    # JIT compiles a plan on every execution once its estimated cost passes jit_above_cost,
    # and a generic plan's cost is estimated for any parameters: the limited claim's passed it
    # on a 100,000-job backlog (11 million), and compiling took 3.3 s of every 12 ms claim
    # (PostgreSQL 15, jit on by default). No hot statement runs long enough to win it back.
    await conn.execute(f"SET plan_cache_mode = force_generic_plan; {JIT_OFF}")


async def _keep_as_is(conn: Any) -> None:
    """Release without asyncpg's reset query (a round trip per request).

    Nothing on these connections changes session state after it is set up (the plan cache mode,
    once, at connect): no SET, LISTEN or advisory lock (those live on the control connection),
    and transactions end inside their block. A connection whose statement was cancelled is
    terminated by its user instead of being released.
    """


async def create_driver_pool(
    url: str,
    *,
    size: int,
    application_name: str = "jobq",
    statement_cache: bool = True,
    connect_timeout: float | None = None,
) -> Any:
    """An asyncpg pool of ``size`` connections whose jsonb values are JSON text in, Python out.

    With ``statement_cache=False`` every statement is prepared unnamed on each call (one more
    Parse per statement): what works through a pooler in transaction mode. A connection that
    breaks (its server stopped, a failover) is closed by asyncpg and replaced on the next
    acquire. A URL listing several hosts connects through :func:`connect_each_host`.
    """
    multi_host = _multi_host_args(url)
    target: dict[str, Any] = (
        {"dsn": driver_dsn(url)}
        if multi_host is None
        else {"connect": connect_each_host, **multi_host}
    )
    return await asyncpg.create_pool(
        **target,
        **_timeout_args(connect_timeout),
        min_size=size,
        max_size=size,
        # Without the statement cache (a pooler in transaction mode) nothing is kept to reuse,
        # and a SET would outlive this client on the pooler's server session.
        init=_setup_generic_plans if statement_cache else _setup_connection,
        reset=_keep_as_is,
        server_settings={"application_name": application_name},
        **statement_cache_args(statement_cache),
    )
