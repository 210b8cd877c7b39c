"""The rights jobq's SQL functions run with: a caller's own objects can never run with them.

``jobq.enqueue()`` is ``SECURITY DEFINER``: it runs with its owner's rights. Before migration 0025
its path named jobq's schema (``public``), so a producer role that could create objects there
(the default before PostgreSQL 15, and any database upgraded from one) added an exact-type
overload of a function the body calls and had it run with those rights: ``ALTER ROLE ...
SUPERUSER`` when the migrating role was a superuser. Here every function and operator the body
and the trigger its insert fires call is attacked that way, on a database of its own; the attack
is shown to work on the revision before (so the test can fail), and to reach nothing now.
"""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

import asyncpg
import pytest

from app.migrations import upgrade
from tests.conftest import create_database, drop_database

PINNED = "search_path=pg_catalog, pg_temp"


@dataclass(frozen=True)
class Overload:
    """A function or operator a producer creates in ``public``, with exactly the argument types
    of a call in the function's body (or of its trigger's), doing the real work by the
    catalogue's own function, and recording that it ran and as whom."""

    name: str  # a function's name, or an operator's symbol
    args: str
    returns: str
    real: str  # the catalogue's work, on $1, $2 ...
    operator: bool = False


OVERLOADS = (
    # The attack found from outside: jsonb_build_array is VARIADIC "any" in pg_catalog, so an
    # exact-type overload wins even behind pg_catalog in the path.
    Overload(
        "jsonb_build_array",
        "text, text, jsonb, integer, timestamptz, double precision, integer, integer, integer, text",
        "jsonb",
        "pg_catalog.jsonb_build_array($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
    ),
    Overload("md5", "text", "text", "pg_catalog.md5($1)"),
    Overload("length", "text", "integer", "pg_catalog.length($1)"),
    Overload("octet_length", "text", "integer", "pg_catalog.octet_length($1)"),
    Overload(
        "make_interval", "secs double precision", "interval", "pg_catalog.make_interval(secs => $1)"
    ),
    Overload("now", "", "timestamptz", "pg_catalog.now()"),
    Overload(
        "jsonb_path_exists", "jsonb, jsonpath", "boolean", "pg_catalog.jsonb_path_exists($1, $2)"
    ),
    Overload("pg_notify", "text, text", "void", "pg_catalog.pg_notify($1, $2)"),
    Overload("date_trunc", "text, timestamptz", "timestamptz", "pg_catalog.date_trunc($1, $2)"),
    Overload("||", "text, integer", "text", "pg_catalog.textcat($1, $2::text)", operator=True),
    Overload("||", "text, text", "text", "pg_catalog.textcat($1, $2)", operator=True),
    Overload("=", "text, text", "boolean", "pg_catalog.texteq($1, $2)", operator=True),
    Overload("~", "text, text", "boolean", "pg_catalog.textregexeq($1, $2)", operator=True),
    Overload("!~", "text, text", "boolean", "pg_catalog.textregexne($1, $2)", operator=True),
    Overload(">", "integer, integer", "boolean", "pg_catalog.int4gt($1, $2)", operator=True),
    Overload(">=", "integer, integer", "boolean", "pg_catalog.int4ge($1, $2)", operator=True),
    Overload("<=", "integer, integer", "boolean", "pg_catalog.int4le($1, $2)", operator=True),
    Overload("-", "integer, integer", "integer", "pg_catalog.int4mi($1, $2)", operator=True),
    Overload("*", "integer, integer", "integer", "pg_catalog.int4mul($1, $2)", operator=True),
    Overload(
        ">",
        "timestamptz, timestamptz",
        "boolean",
        "pg_catalog.timestamptz_gt($1, $2)",
        operator=True,
    ),
    Overload(
        "<=",
        "timestamptz, timestamptz",
        "boolean",
        "pg_catalog.timestamptz_le($1, $2)",
        operator=True,
    ),
    Overload(
        ">=",
        "timestamptz, timestamptz",
        "boolean",
        "pg_catalog.timestamptz_ge($1, $2)",
        operator=True,
    ),
    Overload(
        "<",
        "timestamptz, timestamptz",
        "boolean",
        "pg_catalog.timestamptz_lt($1, $2)",
        operator=True,
    ),
    Overload(
        "+",
        "timestamptz, interval",
        "timestamptz",
        "pg_catalog.timestamptz_pl_interval($1, $2)",
        operator=True,
    ),
    Overload(
        ">=",
        "double precision, double precision",
        "boolean",
        "pg_catalog.float8ge($1, $2)",
        operator=True,
    ),
    Overload(
        "<=",
        "double precision, double precision",
        "boolean",
        "pg_catalog.float8le($1, $2)",
        operator=True,
    ),
)

# Words before "(" in the bodies that call nothing a caller could overload: PL/pgSQL and SQL
# syntax, the function's own name and parameters, casts and column lists.
NOT_CALLS = {
    "and", "as", "begin", "between", "case", "coalesce", "declare", "distinct", "else", "end",
    "enqueue", "exception", "exists", "from", "if", "in", "insert", "into", "jobs", "not",
    "null", "or", "raise", "returning", "row", "select", "then", "using", "values", "when",
    "where", "queue_counts", "conflict", "queue", "group", "by", "jobq_new",
    # The counts trigger's count(*): an aggregate of that signature in public has the same
    # argument types as pg_catalog's, which comes first in every path.
    "count",
}  # fmt: skip
CALLS_IN_BODIES = r"\b([a-z_][a-z0-9_]*)\s*\("


@pytest.fixture
def fresh_database(pg_server_url: str) -> Iterator[str]:
    """A database of its own: the attacker's objects in ``public`` must not meet other tests."""
    url = create_database(pg_server_url, prefix="jobq_rights")
    yield url
    drop_database(pg_server_url, url)


@pytest.fixture
async def shop(fresh_database: str) -> AsyncIterator[str]:
    """A producer's role: granted jobq_producer, and allowed to create objects in public."""
    role = f"shop_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(fresh_database)
    try:
        await admin.execute(f"CREATE ROLE {role} LOGIN")
        yield role
        await admin.execute(f"DROP OWNED BY {role}")
        await admin.execute(f"DROP ROLE {role}")
    finally:
        await admin.close()


async def _arm(url: str, role: str) -> asyncpg.Connection:
    """The producer's connection, after it created every overload in public."""
    admin = await asyncpg.connect(url)
    try:
        if await admin.fetchval("SELECT to_regrole('jobq_producer') IS NOT NULL"):
            await admin.execute(f"GRANT jobq_producer TO {role}")
        await admin.execute(f"GRANT CREATE, USAGE ON SCHEMA public TO {role}")
        database = await admin.fetchval("SELECT current_database()")
        await admin.execute(f'GRANT CONNECT ON DATABASE "{database}" TO {role}')
    finally:
        await admin.close()
    shop = await asyncpg.connect(url, user=role)
    await shop.execute(
        "CREATE TABLE public.hijacked (name text, ran_as text);"
        "GRANT INSERT ON public.hijacked TO PUBLIC"
    )
    for number, o in enumerate(OVERLOADS):
        function = o.name if not o.operator else f"attack_{number}"
        work = f"PERFORM {o.real}; RETURN;" if o.returns == "void" else f"RETURN {o.real};"
        await shop.execute(
            f"""
            CREATE FUNCTION public.{function}({o.args}) RETURNS {o.returns}
            LANGUAGE plpgsql AS $$
            BEGIN
                INSERT INTO public.hijacked VALUES ('{o.name}({o.args})', current_user);
                BEGIN
                    ALTER ROLE {role} SUPERUSER;
                EXCEPTION WHEN insufficient_privilege THEN
                    NULL;
                END;
                {work}
            END $$
            """
        )
        if o.operator:
            left, right = (a.strip() for a in o.args.split(","))
            await shop.execute(
                f"CREATE OPERATOR public.{o.name} (LEFTARG = {left}, RIGHTARG = {right}, "
                f"FUNCTION = public.{function})"
            )
    return shop


async def _enqueue_every_way(shop: asyncpg.Connection) -> None:
    """Calls jobq.enqueue() down every path of its body: defaults, a key and its replay, a key
    reused (refused), a delay, a trace context, a payload long enough for the nesting and
    number checks to walk it."""
    await shop.fetchval("SELECT jobq.enqueue('q', 't')")
    await shop.fetchval("SELECT jobq.enqueue('q', 't', idempotency_key => 'k')")
    await shop.fetchval("SELECT jobq.enqueue('q', 't', idempotency_key => 'k')")
    with pytest.raises(asyncpg.UniqueViolationError):
        await shop.fetchval("SELECT jobq.enqueue('q', 'other', idempotency_key => 'k')")
    await shop.fetchval("SELECT jobq.enqueue('q', 't', delay_seconds => 60, wake => false)")
    await shop.fetchval(
        "SELECT jobq.enqueue('q', 't', run_at => now() + interval '1 hour', max_attempts => 3, "
        "lease_seconds => 60, timeout_seconds => 600, concurrency_key => 'c', "
        "traceparent => '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01')"
    )
    digits = "9" * 320
    await shop.fetchval(
        "SELECT jobq.enqueue('q', 't', $1::jsonb)",
        f'{{"deep": {"[" * 60}"{digits}"{"]" * 60}, "n": 1.5}}',
    )


async def test_the_attack_worked_before_0025_so_this_test_can_fail(
    fresh_database: str, shop: str
) -> None:
    await asyncio.to_thread(upgrade, fresh_database, "0024")  # Alembic runs its own loop
    producer = await _arm(fresh_database, shop)
    try:
        await producer.fetchval("SELECT jobq.enqueue('q', 't', idempotency_key => 'k')")
        hits = await producer.fetch("SELECT name, ran_as FROM public.hijacked")
        super_now = await producer.fetchval(
            "SELECT rolsuper FROM pg_roles WHERE rolname = current_user"
        )
    finally:
        await producer.close()
    assert any(h["name"].startswith("jsonb_build_array(") for h in hits), hits
    assert super_now, "the overload ran with a superuser's rights and made the producer one"


async def test_no_overload_of_a_producer_runs_inside_jobq_enqueue(
    fresh_database: str, shop: str
) -> None:
    await asyncio.to_thread(upgrade, fresh_database)
    producer = await _arm(fresh_database, shop)
    try:
        await _enqueue_every_way(producer)
        hits = await producer.fetch("SELECT name, ran_as FROM public.hijacked")
        super_now = await producer.fetchval(
            "SELECT rolsuper FROM pg_roles WHERE rolname = current_user"
        )
    finally:
        await producer.close()
    assert [dict(h) for h in hits] == []
    assert not super_now
    admin = await asyncpg.connect(fresh_database)
    try:
        assert await admin.fetchval("SELECT count(*) FROM jobs") == 5
    finally:
        await admin.close()


async def test_the_overloads_cover_every_call_in_the_body_and_its_trigger(
    database_url: str,
) -> None:
    conn = await asyncpg.connect(database_url)
    try:
        bodies = await conn.fetch(
            "SELECT p.proname, p.prosrc FROM pg_proc p "
            "WHERE p.oid IN ('jobq.enqueue'::regproc, 'jobq_counts_inserted'::regproc)"
        )
    finally:
        await conn.close()

    def code(body: str) -> str:  # without comments and string literals
        return re.sub(r"'(?:[^']|'')*'", "''", re.sub(r"--[^\n]*", "", body))

    called = {
        name.lower()
        for body in bodies
        for name in re.findall(CALLS_IN_BODIES, code(body["prosrc"]), re.I)
    }
    overloaded = {o.name for o in OVERLOADS if not o.operator}
    assert called - NOT_CALLS - overloaded == set(), "a call with no overload in OVERLOADS"


async def test_every_security_definer_and_trigger_function_pins_its_path(
    database_url: str,
) -> None:
    conn = await asyncpg.connect(database_url)
    try:
        unpinned = await conn.fetch(
            """
            SELECT p.oid::regprocedure::text AS name, p.proconfig
            FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
            WHERE n.nspname NOT IN ('pg_catalog', 'information_schema')
              AND (p.prosecdef
                   OR p.oid IN (SELECT tgfoid FROM pg_trigger WHERE NOT tgisinternal))
              AND NOT (COALESCE(p.proconfig, '{}') @> ARRAY[$1])
            """,
            PINNED,
        )
        definers = await conn.fetch(
            "SELECT p.oid::regprocedure::text AS name FROM pg_proc p WHERE p.prosecdef"
        )
    finally:
        await conn.close()
    assert [d["name"] for d in definers] != [], "jobq.enqueue() is SECURITY DEFINER"
    assert [dict(u) for u in unpinned] == []


async def test_the_enqueue_function_is_owned_by_a_role_with_only_what_it_needs(
    database_url: str,
) -> None:
    conn = await asyncpg.connect(database_url)
    try:
        owner = await conn.fetchval(
            "SELECT proowner::regrole::text FROM pg_proc WHERE oid = 'jobq.enqueue'::regproc"
        )
        rights = await conn.fetchrow(
            """
            SELECT r.rolsuper, r.rolcreaterole, r.rolcreatedb, r.rolcanlogin, r.rolbypassrls,
                   has_table_privilege($1, 'jobs', 'UPDATE') AS update_jobs,
                   has_table_privilege($1, 'jobs', 'DELETE') AS delete_jobs,
                   has_column_privilege($1, 'jobs', 'payload', 'SELECT') AS read_payloads,
                   has_table_privilege($1, 'api_keys', 'SELECT') AS read_keys,
                   has_table_privilege($1, 'jobq.enqueue_limits', 'UPDATE') AS write_limits,
                   has_schema_privilege($1, 'jobq', 'CREATE') AS create_in_jobq
            FROM pg_roles r WHERE r.rolname = $1
            """,
            owner,
        )
    finally:
        await conn.close()
    assert owner == "jobq_definer"
    assert not any(rights.values()), dict(rights)
