"""The ``jobq`` command: ``serve``, ``migrate``, ``openapi`` and ``worker``."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from typing import Any

from app.settings import Settings


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
    settings = Settings(**overrides)
    if args.supervised:
        # One of the processes of `--workers N`: the parent migrated and passed DATABASE_URL.
        from app.supervisor import reuse_port_socket

        server = JobqServer.for_app(create_app(settings), log_level=args.log_level)
        server.run(sockets=[reuse_port_socket(settings.host, settings.port)])
        return 0
    url = resolve_database_url(settings, verbose=args.verbose)
    upgrade(url)
    settings = settings.model_copy(update={"database_url": url})
    base = f"http://{settings.host}:{settings.port}"
    processes = f", {settings.workers} processes" if settings.workers > 1 else ""
    print(
        f"jobq serving on {base}  (API {base}/v1, docs {base}/docs, health {base}/healthz"
        f"{processes})",
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
    JobqServer.for_app(create_app(settings), log_level=args.log_level).run()
    return 0


def _migrate(_: argparse.Namespace) -> int:
    from app.migrations import upgrade

    upgrade(resolve_database_url(Settings()))
    print("migrated to head", flush=True)
    return 0


def _openapi(_: argparse.Namespace) -> int:
    json.dump(openapi_document(), sys.stdout, indent=2, sort_keys=False)
    sys.stdout.write("\n")
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
        "--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"]
    )
    serve.add_argument(
        "--workers",
        type=int,
        default=None,
        help="server processes on the port (default JOBQ_WORKERS or 1)",
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
    openapi = sub.add_parser("openapi", help="print the OpenAPI document")
    openapi.set_defaults(func=_openapi)
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
    level = getattr(logging, str(getattr(args, "log_level", "info")).upper())
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    logging.getLogger("alembic.runtime.plugins").setLevel(logging.WARNING)  # one line per plugin
    if not getattr(args, "verbose", False):
        # A line per migration step is for whoever asks; jobq says where it serves.
        logging.getLogger("alembic").setLevel(logging.WARNING)
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
