"""The ``jobq`` command: ``serve``, ``migrate``, ``keys``, ``openapi`` and ``worker``."""

from __future__ import annotations

import argparse
import asyncio
import gc
import getpass
import ipaddress
import json
import logging
import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from pydantic import ValidationError

from app.logs import configure as configure_logs
from app.settings import Settings, env_name

T = TypeVar("T")


def resolve_database_url(settings: Settings, *, verbose: bool = False) -> str:
    """``DATABASE_URL`` when set; otherwise the embedded server under ``JOBQ_DATA_DIR`` (started here)."""
    if settings.database_url:
        return settings.database_url
    from app.embedded import start_embedded_postgres

    return start_embedded_postgres(settings.data_dir, verbose=verbose)


def openapi_document() -> dict[str, Any]:
    """The OpenAPI document of the app (no database needed)."""
    from app.main import create_app

    return create_app(Settings(database_url="postgresql://unused/unused")).openapi()


def _serve(args: argparse.Namespace) -> int:
    from app.main import create_app
    from app.migrations import upgrade
    from app.server import JobqServer

    overrides: dict[str, Any] = {}
    if args.host is not None:
        overrides["host"] = args.host
    if args.port is not None:
        overrides["port"] = args.port
    if args.workers is not None:
        overrides["workers"] = args.workers
    if args.insecure:
        overrides["insecure"] = True
    settings = Settings(**overrides)
    if settings.schedules is not None and not args.supervised:
        problem = _schedules_file_problem(settings)
        if problem is not None:
            print(f"jobq: invalid JOBQ_SCHEDULES file {problem}", file=sys.stderr, flush=True)
            return 2
    if args.supervised:
        # One of the processes of `--workers N`: the parent migrated and passed DATABASE_URL.
        from app.supervisor import reuse_port_socket

        server = JobqServer.for_app(create_app(settings), log_level=args.log_level)
        _freeze_heap()
        server.run(sockets=[reuse_port_socket(settings.host, settings.port)])
        return 0
    url = resolve_database_url(settings, verbose=args.verbose)
    # Migrations and one-off statements bypass a transaction-mode pooler (JOBQ_DIRECT_DATABASE_URL).
    direct = settings.direct_database_url or url
    upgrade(direct)
    settings = settings.model_copy(update={"database_url": url})
    if not is_loopback(settings.host) and not _run_on(direct, _any_keys):
        if not settings.insecure:
            print(
                f"jobq: refusing to serve {settings.host} with no API keys: anyone who can reach "
                "it could use it. Make a key first (jobq keys create --role admin --name NAME), "
                "serve on 127.0.0.1, or pass --insecure (JOBQ_INSECURE=true) to insist.",
                file=sys.stderr,
                flush=True,
            )
            return 2
        print(
            f"jobq: serving {settings.host} WITHOUT authentication (--insecure)",
            file=sys.stderr,
            flush=True,
        )
    base = f"http://{settings.host}:{settings.port}"
    processes = f", {settings.workers} processes" if settings.workers > 1 else ""
    print(
        f"jobq serving on {base}  (API {base}/v1, dashboard {base}/dashboard, docs {base}/docs, "
        f"health {base}/healthz{processes})",
        flush=True,
    )
    if settings.workers > 1:
        from app.supervisor import Supervisor, child_argv, child_environment

        return Supervisor(
            argv=child_argv(settings.host, settings.port, args.log_level),
            env=child_environment(url),
            count=settings.workers,
            grace_seconds=settings.shutdown_grace_seconds + 5,
        ).run()
    server = JobqServer.for_app(create_app(settings), log_level=args.log_level)
    _freeze_heap()
    server.run()
    return 0


def _freeze_heap() -> None:
    """Takes what is built by now (modules, models, the app) out of the garbage collector's sight.

    It lives as long as the process, and a full collection walked all of it on some request's
    time (docs/adr/0009-frozen-start-up-heap.md). Garbage is collected first, so none is kept.
    """
    gc.collect()
    gc.freeze()


def _schedules_file_problem(settings: Settings) -> str | None:
    """What is wrong with the JOBQ_SCHEDULES file, in one line (``None``: it is usable)."""
    from app.api.schedules_file import ScheduleFileError, load_schedules_file

    if settings.schedules is None:
        return None
    try:
        load_schedules_file(settings.schedules, settings)
    except ScheduleFileError as exc:
        return " ".join(str(exc).splitlines())
    return None


def is_loopback(host: str) -> bool:
    """Whether a listen address reaches this machine only (a name other than localhost does not count)."""
    if host.strip("[]").lower() in {"localhost", "localhost."}:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _run_on(url: str, work: Callable[[Any], Awaitable[T]], *, transaction: bool = False) -> T:
    """Runs ``work(connection)`` on the database once, from a synchronous command."""
    from app.db import create_admin_engine

    async def run() -> T:
        engine = create_admin_engine(url)
        try:
            if transaction:
                async with engine.begin() as conn:
                    return await work(conn)
            async with engine.connect() as conn:
                return await work(conn)
        finally:
            await engine.dispose()

    return asyncio.run(run())


async def _any_keys(conn: Any) -> bool:
    from app.auth import store

    return await store.any_keys(conn)


def _cli_actor() -> str:
    """Who the audit trail names for a keys command: ``cli:<OS user>`` (``cli`` if unknown)."""
    try:
        return f"cli:{getpass.getuser()}"
    except (OSError, KeyError, ImportError):
        return "cli"


class NoKeyStoreError(Exception):
    """A keys command found no database to use: it never makes one (only serve and migrate do)."""


def _keys_url() -> str:
    from app.embedded import cluster_exists, cluster_folder
    from app.migrations import upgrade

    settings = Settings()
    no_url = not (settings.direct_database_url or settings.database_url)
    if no_url and not cluster_exists(settings.data_dir):
        # A new embedded cluster here would take the key, and the server, which runs on another
        # data folder, would refuse it at sign-in.
        raise NoKeyStoreError(
            f"no jobq database in {cluster_folder(settings.data_dir)}: set DATABASE_URL to the "
            f"server's database, or {env_name('data_dir')} to the data folder `jobq serve` uses"
        )
    url = settings.direct_database_url or resolve_database_url(settings)
    upgrade(url)
    return url


def _keys_create(args: argparse.Namespace) -> int:
    from sqlalchemy.exc import IntegrityError

    from app.auth import store
    from app.auth.keys import KEY_NAME_PATTERN, Role, scope_error
    from app.errors import sqlstate

    if not KEY_NAME_PATTERN.match(args.name):
        print(
            "jobq keys: --name: a letter or digit, then up to 63 of letters, digits, _ . : -",
            file=sys.stderr,
        )
        return 2
    queues = [q.strip() for q in args.queues.split(",")] if args.queues is not None else None
    if queues is not None and (problem := scope_error(queues)) is not None:
        print(f"jobq keys: --queues: {problem}", file=sys.stderr)
        return 2

    role, actor = Role(args.role), _cli_actor()

    async def create(conn: Any) -> str:
        return await store.create_key(conn, name=args.name, role=role, queues=queues, actor=actor)

    async def refused(conn: Any) -> None:
        await store.record_refused_create(
            conn, name=args.name, role=role, queues=queues, actor=actor
        )

    url = _keys_url()
    try:
        secret = _run_on(url, create, transaction=True)
    except IntegrityError as exc:
        if sqlstate(exc) != "23505":
            raise
        _run_on(url, refused, transaction=True)  # the failed insert rolled its transaction back
        print(f"jobq keys: a key named {args.name!r} exists already", file=sys.stderr)
        return 1
    scope = ", ".join(queues) if queues is not None else "every queue"
    print(
        f"created {args.role} key {args.name!r} for {scope}; its webhook signing secret: "
        f"jobq keys webhook-secret {args.name}; the key is shown once:",
        file=sys.stderr,
    )
    print(secret, flush=True)  # alone on stdout, for scripts: KEY=$(jobq keys create ...)
    return 0


def _keys_list(_: argparse.Namespace) -> int:
    from app.auth import store

    keys = _run_on(_keys_url(), store.list_keys)
    print("id\tname\trole\tqueues\tcreated\trevoked")
    for key in keys:
        queues = ",".join(key.queues) if key.queues is not None else "*"
        revoked = key.revoked_at.isoformat(timespec="seconds") if key.revoked_at else "-"
        print(
            f"{key.id}\t{key.name}\t{key.role}\t{queues}\t"
            f"{key.created_at.isoformat(timespec='seconds')}\t{revoked}"
        )
    return 0


def _keys_revoke(args: argparse.Namespace) -> int:
    from app.auth import store

    actor = _cli_actor()

    async def revoke(conn: Any) -> bool:
        return await store.revoke_key(conn, name=args.name, actor=actor)

    if not _run_on(_keys_url(), revoke, transaction=True):
        print(f"jobq keys: no live key named {args.name!r}", file=sys.stderr)
        return 1
    print(f"revoked key {args.name!r}; every instance refuses it within a second", file=sys.stderr)
    return 0


def _keys_webhook_secret(args: argparse.Namespace) -> int:
    from app.auth import store

    grace, actor = Settings().webhook_secret_grace_seconds, _cli_actor()

    async def read(conn: Any) -> Any:
        return await store.webhook_secret(
            conn, name=args.name, rotate=args.rotate, grace_seconds=grace, actor=actor
        )

    row = _run_on(_keys_url(), read, transaction=True)
    if row is None:
        print(f"jobq keys: no live key named {args.name!r}", file=sys.stderr)
        return 1
    if row.previous_secret is not None and row.previous_valid_until is not None:
        until = row.previous_valid_until.isoformat(timespec="seconds")
        print(f"the previous secret also signs until {until}:", file=sys.stderr)
        print(row.previous_secret, file=sys.stderr)
    print(row.secret, flush=True)  # alone on stdout, for scripts
    return 0


def _migrate(_: argparse.Namespace) -> int:
    from app.migrations import upgrade

    settings = Settings()
    upgrade(settings.direct_database_url or resolve_database_url(settings))
    print("migrated to head", flush=True)
    return 0


def _openapi(_: argparse.Namespace) -> int:
    json.dump(openapi_document(), sys.stdout, indent=2, sort_keys=False)
    sys.stdout.write("\n")
    return 0


def _sql(args: argparse.Namespace) -> int:
    """Prints a named statement or a schema object, ready for EXPLAIN or psql; lists them all."""
    from app.store.schema import schema_object, schema_objects
    from app.store.statements import load_statements

    statements = load_statements()
    if args.name is None:
        for name, named in sorted(statements.items()):
            print(f"{name}  {named.description}")
        for obj in schema_objects():
            print(f"{obj.name}  ({obj.kind}, app/store/sql/schema/{obj.file})")
        return 0
    if args.name in statements:
        named = statements[args.name]
        text, binds = named.positional
        print(f"-- {named.name}: {named.description}")
        if binds:
            print("-- " + ", ".join(f"${n} = :{bind}" for n, bind in enumerate(binds, 1)))
        print(text.strip().removesuffix(";") + ";")
        return 0
    try:
        obj = schema_object(args.name)
    except KeyError:
        print(
            f"jobq sql: no statement, function, trigger or view named {args.name!r} "
            "(`jobq sql` lists them)",
            file=sys.stderr,
        )
        return 2
    print(f"-- {obj.kind} {obj.name} (app/store/sql/schema/{obj.file}): {obj.description}")
    print(obj.statement(args.schema) + ";")
    return 0


def _worker(args: argparse.Namespace) -> int:
    from jobq_client.cli import run_worker

    return run_worker(args.target, args.url)


def build_parser() -> argparse.ArgumentParser:
    """The command-line parser."""
    parser = argparse.ArgumentParser(prog="jobq", description="HTTP job queue on PostgreSQL")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser(
        "serve", help="migrate, then serve the API (embedded PostgreSQL when DATABASE_URL is unset)"
    )
    serve.add_argument("--host", default=None, help="default JOBQ_HOST or 127.0.0.1")
    serve.add_argument("--port", type=int, default=None, help="default JOBQ_PORT or 8000")
    serve.add_argument(
        "--log-level",
        default=None,
        choices=["critical", "error", "warning", "info", "debug"],
        help="default JOBQ_LOG_LEVEL or info (info: errors, slow requests, a summary a minute; "
        "JOBQ_LOG_ACCESS and JOBQ_LOG_JOBS choose which requests and job changes get a line)",
    )
    serve.add_argument(
        "--workers",
        type=int,
        default=None,
        help="server processes on the port (default JOBQ_WORKERS or 1)",
    )
    serve.add_argument(
        "--insecure",
        action="store_true",
        help="serve a non-loopback address even with no API keys (anyone reaching it may use it)",
    )
    serve.add_argument("--supervised", action="store_true", help=argparse.SUPPRESS)
    serve.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="also show the embedded server's and the migrations' own output",
    )
    serve.set_defaults(func=_serve)
    migrate = sub.add_parser("migrate", help="run the database migrations and exit")
    migrate.set_defaults(func=_migrate)
    keys = sub.add_parser("keys", help="make, list and revoke API keys")
    keys_sub = keys.add_subparsers(dest="keys_command", required=True)
    create = keys_sub.add_parser("create", help="make a key; prints its secret, once, on stdout")
    create.add_argument("--role", required=True, choices=["producer", "worker", "viewer", "admin"])
    create.add_argument("--name", required=True, help="unique name, shown in logs and listings")
    create.add_argument(
        "--queues",
        default=None,
        help="limit the key to these queues: names or patterns with *, comma-separated "
        "(e.g. 'emails,billing.*'); default every queue",
    )
    create.set_defaults(func=_keys_create)
    list_keys = keys_sub.add_parser("list", help="list keys (never their secrets)")
    list_keys.set_defaults(func=_keys_list)
    revoke = keys_sub.add_parser("revoke", help="revoke a key by name")
    revoke.add_argument("name")
    revoke.set_defaults(func=_keys_revoke)
    webhook = keys_sub.add_parser(
        "webhook-secret",
        help="print the secret that signs the webhooks of a key's jobs (on stdout)",
    )
    webhook.add_argument("name")
    webhook.add_argument(
        "--rotate",
        action="store_true",
        help="make a new one first; the previous one also signs for "
        "JOBQ_WEBHOOK_SECRET_GRACE_SECONDS",
    )
    webhook.set_defaults(func=_keys_webhook_secret)
    openapi = sub.add_parser("openapi", help="print the OpenAPI document")
    openapi.set_defaults(func=_openapi)
    sql = sub.add_parser(
        "sql",
        help="print a statement the service sends (its fragments written in, $n binds) or a "
        "function, trigger or view as app/store/sql/schema/ defines it; no name: list them",
    )
    sql.add_argument("name", nargs="?", help="what to print (none: list every name)")
    sql.add_argument(
        "--schema", default="public", help="jobq's schema, written in for __S__ (public)"
    )
    sql.set_defaults(func=_sql)
    worker = sub.add_parser(
        "worker", help="run a jobq_client Worker (module:attr) until SIGTERM / SIGINT"
    )
    from jobq_client.cli import build_parser as build_worker_parser

    build_worker_parser(worker)
    worker.set_defaults(func=_worker)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``jobq`` console script."""
    args = build_parser().parse_args(argv)
    try:
        settings = Settings()
    except ValidationError:
        settings = Settings.model_construct()  # the command that reads them reports the error
    if getattr(args, "log_level", None) is None:
        args.log_level = settings.log_level
    configure_logs(level=args.log_level, log_format=settings.log_format)
    logging.getLogger("alembic.runtime.plugins").setLevel(logging.WARNING)  # one line per plugin
    if not getattr(args, "verbose", False):
        # A line per migration step is for whoever asks; jobq says where it serves.
        logging.getLogger("alembic").setLevel(logging.WARNING)
    try:
        code: int = args.func(args)
    except ValidationError as exc:
        if exc.title != Settings.__name__:
            raise
        print(f"jobq: {invalid_settings(exc)}", file=sys.stderr)
        return 2
    except NoKeyStoreError as exc:
        print(f"jobq keys: {exc}", file=sys.stderr)
        return 2
    return code


def invalid_settings(exc: ValidationError) -> str:
    """One line naming each invalid setting by its environment variable, and what is wrong."""
    problems = []
    for error in exc.errors():
        loc = error.get("loc") or ()
        name = str(loc[0]) if loc else ""
        variable = env_name(name) if name in Settings.model_fields else "settings"
        # A URL may carry a password: name it, never echo it.
        shown = "" if name.endswith("url") else f"={error.get('input')!r}"
        problems.append(f"{variable}{shown}: {error.get('msg')}")
    return "invalid setting " + "; ".join(problems)


if __name__ == "__main__":
    sys.exit(main())
