"""``jobq worker module:attr``: imports a :class:`Worker` (or a factory of one) and runs it until stopped."""

from __future__ import annotations

import argparse
import asyncio
import importlib
import inspect
import logging
import os
import sys
from collections.abc import Sequence

from jobq_client.worker import Worker

URL_ENV = "JOBQ_URL"
API_KEY_ENV = "JOBQ_API_KEY"


class TargetError(Exception):
    """The ``module:attr`` target cannot be loaded or is not a Worker."""


def load_worker(target: str) -> Worker:
    """Imports ``module`` and answers its attribute ``attr`` (dotted allowed) as a Worker.

    The attribute may be a :class:`Worker` or a callable taking no arguments that returns one.
    The current directory is importable, as it is for ``python -m``.
    """
    module_name, sep, attr_path = target.partition(":")
    if not sep or not module_name or not attr_path:
        raise TargetError(f"expected module:attribute, got {target!r}")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        obj: object = importlib.import_module(module_name)
    except ImportError as exc:
        raise TargetError(f"cannot import {module_name!r}: {exc}") from exc
    for name in attr_path.split("."):
        try:
            obj = getattr(obj, name)
        except AttributeError:
            raise TargetError(f"{module_name!r} has no attribute {attr_path!r}") from None
    if not isinstance(obj, Worker) and callable(obj):
        if inspect.iscoroutinefunction(obj):
            raise TargetError(f"{target} is an async function; name a Worker or a plain factory")
        try:
            obj = obj()
        except Exception as exc:
            raise TargetError(f"calling {target}() failed: {type(exc).__name__}: {exc}") from exc
    if not isinstance(obj, Worker):
        raise TargetError(f"{target} is {type(obj).__name__}, not a jobq_client.Worker")
    return obj


def run_worker(target: str, url: str | None = None) -> int:
    """Loads the Worker named by ``target`` and runs it with signal handling; answers the exit code.

    ``url`` (else ``JOBQ_URL``, else the Worker's own ``base_url``) is the service to work for;
    ``JOBQ_API_KEY``, when set, is the worker key it sends (else the Worker's own ``api_key``).
    Exit codes: 0 after a graceful stop, 1 when the worker failed, 2 for a bad target.
    """
    if not logging.getLogger().handlers:
        logging.basicConfig(
            level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s"
        )
    # One INFO line per HTTP request (heartbeats included) drowns what the worker itself says.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    try:
        worker = load_worker(target)
    except TargetError as exc:
        print(f"jobq worker: {exc}", file=sys.stderr)
        return 2
    url = url or os.environ.get(URL_ENV)
    if url:
        worker.base_url = url
    if os.environ.get(API_KEY_ENV):
        worker.api_key = os.environ[API_KEY_ENV]
    try:
        asyncio.run(worker.run(install_signal_handlers=True))
    except Exception:
        logging.getLogger("jobq_client.worker").exception("worker %s failed", worker.worker_id)
        return 1
    return 0


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    """Adds the worker command's arguments to ``parser`` (a new one when not given)."""
    parser = parser or argparse.ArgumentParser(
        prog="jobq-worker", description="run a jobq_client Worker until SIGTERM / SIGINT"
    )
    parser.add_argument(
        "target", help="module:attribute naming a jobq_client.Worker or a factory of one"
    )
    parser.add_argument(
        "--url", default=None, help=f"jobq service URL (default: ${URL_ENV} or the Worker's own)"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m jobq_client``."""
    args = build_parser().parse_args(argv)
    return run_worker(args.target, args.url)
