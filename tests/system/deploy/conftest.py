"""The deployment tests: the container image built and run with podman, and the compose file.

``image`` marks the tests that build and run the image (three minutes cold, about 40 s with
the caches warm). They skip where podman is missing, and fail instead when ``CI=true``.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from sqlalchemy.engine import make_url

from tests.conftest import create_database, drop_database
from tests.system.deploy.podman import BUILD_TIMEOUT_SECONDS, REPO_ROOT, podman, podman_env


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "image: builds jobq's container image with podman and runs it (tests/system/deploy)",
    )


@pytest.fixture(scope="session")
def podman_ready() -> None:
    """Skips (fails when CI=true) where podman cannot build images here."""
    missing = [tool for tool in ("podman", "runc") if shutil.which(tool) is None]
    problem = None
    if missing:
        problem = f"{', '.join(missing)} not installed (apt-get install podman runc debootstrap)"
    elif os.geteuid() != 0:
        problem = "the image tests run podman as root (rootless podman is not set up here)"
    if problem is None:
        return
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"image tests cannot run: {problem}")
    pytest.skip(f"image tests need podman: {problem}")


@pytest.fixture(scope="session")
def image(podman_ready: None) -> Iterator[str]:
    """jobq's image, built once per session from the working tree; removed afterwards."""
    tag = f"localhost/jobq-test:{uuid.uuid4().hex[:10]}"
    started = time.monotonic()
    result = subprocess.run(
        [str(REPO_ROOT / "deploy" / "build-image.sh"), tag],
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT_SECONDS,
        env=podman_env(),
        check=False,
    )
    try:
        assert result.returncode == 0, (
            f"image build failed ({result.returncode})\n{result.stdout[-8000:]}\n{result.stderr[-4000:]}"
        )
        print(f"image {tag} built in {time.monotonic() - started:.1f} s")
        yield tag
    finally:
        podman("rmi", "--force", tag, check=False)


def _tcp_answers(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


@dataclass
class Database:
    """A fresh database for the container, on a server it reaches over the host network."""

    url: str


def _tcp_server_url() -> str | None:
    for name in ("TEST_DATABASE_URL", "JOBQ_PLAN_DATABASE_URL"):
        candidate = os.environ.get(name)
        if candidate and make_url(candidate).host:
            return candidate
    if _tcp_answers("127.0.0.1", 5432):
        return "postgresql://postgres@127.0.0.1:5432/postgres"
    return None


@pytest.fixture(scope="module")
def database() -> Iterator[Database]:
    """A new database on a TCP server; dropped afterwards.

    The tests' embedded server does not do: it listens on a socket in a folder only its own
    user may enter, which the image's user cannot reach even when the folder is mounted.
    """
    server_url = _tcp_server_url()
    if server_url is None:
        problem = (
            "the image tests need PostgreSQL over TCP: set TEST_DATABASE_URL "
            "(e.g. postgresql://postgres@127.0.0.1:5432/postgres) or run one on 127.0.0.1:5432"
        )
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(problem)
        pytest.skip(problem)
    url = create_database(server_url, prefix="jobq_image")
    try:
        yield Database(url=url)
    finally:
        drop_database(server_url, url)
