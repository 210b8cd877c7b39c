"""jobq's container image, built with podman from the Dockerfile and run against a real PostgreSQL.

The base (debian:bookworm-slim) is made by ``deploy/build-base.sh`` from Debian's archive, or
imported from its cached tarball; the image is built by ``deploy/build-image.sh``, so every step
after FROM runs for real. The container shares the host's network (``--network host``) and
talks to a PostgreSQL over TCP: ``TEST_DATABASE_URL`` or ``JOBQ_PLAN_DATABASE_URL`` when they
name a TCP server, else the machine's server on 127.0.0.1:5432 when it answers (skipped
otherwise, failed when ``CI=true``).

The tests leave no container and no tagged image behind; the base image, the base tarball, the
pip cache and podman's layer cache are kept so that the next run is fast.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.processes import free_port
from tests.system.deploy.conftest import Database
from tests.system.deploy.podman import podman

pytestmark = pytest.mark.image

REPO_ROOT = Path(__file__).resolve().parents[3]
READY_TIMEOUT_SECONDS = 60.0
# The stop timeout the Dockerfile documents: JOBQ_SHUTDOWN_GRACE_SECONDS (10) + 5.
STOP_GRACE_SECONDS = 15
IMAGE_UID = 10001


@dataclass
class Container:
    """The image run once with ``jobq serve`` on a free port of the host network."""

    name: str
    port: int
    key: str

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def run_once(image: str, database: Database, *argv: str) -> subprocess.CompletedProcess[str]:
    """``podman run --rm IMAGE ARGV``: a one-shot jobq command against the database."""
    return podman(
        "run",
        "--rm",
        "--network",
        "host",
        "-e",
        f"DATABASE_URL={database.url}",
        image,
        *argv,
        check=False,
    )


def _wait_ready(container: str, url: str) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_SECONDS
    last = "no answer"
    while time.monotonic() < deadline:
        try:
            response = httpx.get(f"{url}/readyz", timeout=2)
            if response.status_code == 200:
                return
            last = f"{response.status_code} {response.text[:200]}"
        except httpx.HTTPError as exc:
            last = repr(exc)
        state = podman("inspect", "--format", "{{.State.Status}}", container).stdout.strip()
        if state != "running":
            break
        time.sleep(0.5)
    logs = podman("logs", container, check=False)
    raise AssertionError(f"/readyz never answered 200 ({last})\n{logs.stdout}\n{logs.stderr}")


@pytest.fixture(scope="module")
def served(image: str, database: Database) -> Iterator[Container]:
    """Migrates, makes an admin key, then runs the image's default command; removed afterwards."""
    migrated = run_once(image, database, "migrate")
    assert migrated.returncode == 0, migrated.stderr
    assert "migrated to head" in migrated.stdout

    # Secure by default: the image binds 0.0.0.0, so with no key yet it refuses to serve.
    refused = run_once(image, database, "serve")
    assert refused.returncode == 2, (refused.stdout, refused.stderr)
    assert "refusing to serve 0.0.0.0 with no API keys" in refused.stderr

    created = run_once(image, database, "keys", "create", "--role", "admin", "--name", "image")
    assert created.returncode == 0, created.stderr
    key = created.stdout.strip()
    assert key.startswith("jobq_"), created.stdout

    name, port = f"jobq-test-{uuid.uuid4().hex[:10]}", free_port()
    podman(
        "run",
        "--detach",
        "--name",
        name,
        "--network",
        "host",
        # No systemd here to run the health check on a timer; the test runs it itself.
        "--health-interval",
        "disable",
        "-e",
        f"DATABASE_URL={database.url}",
        "-e",
        f"JOBQ_PORT={port}",
        image,
    )
    try:
        _wait_ready(name, f"http://127.0.0.1:{port}")
        yield Container(name=name, port=port, key=key)
    finally:
        podman("rm", "--force", "--time", "0", name, check=False)


def test_ready_with_keys_required(served: Container) -> None:
    assert httpx.get(f"{served.base_url}/readyz", timeout=5).status_code == 200
    assert httpx.get(f"{served.base_url}/v1/queues", timeout=5).status_code == 401
    authorized = httpx.get(
        f"{served.base_url}/v1/queues",
        headers={"Authorization": f"Bearer {served.key}"},
        timeout=5,
    )
    assert authorized.status_code == 200, authorized.text


def test_runs_as_the_non_root_user(served: Container) -> None:
    status = podman("exec", served.name, "cat", "/proc/1/status").stdout
    uids = next(line.split()[1:] for line in status.splitlines() if line.startswith("Uid:"))
    assert uids == [str(IMAGE_UID)] * 4, status
    cmdline = podman("exec", served.name, "cat", "/proc/1/cmdline").stdout.split("\0")
    assert cmdline[1:3] == ["/opt/jobq/bin/jobq", "serve"], cmdline


def test_image_healthcheck_passes(image: str, served: Container) -> None:
    inspected = json.loads(podman("image", "inspect", image).stdout)[0]
    config = inspected["Config"]
    # podman shows the health check beside the OCI config, docker inside it.
    healthcheck = inspected.get("Healthcheck") or config.get("Healthcheck") or {}
    assert "/readyz" in " ".join(healthcheck.get("Test", [])), inspected
    assert config.get("StopSignal") in {"SIGTERM", "15"}, config
    assert config.get("User", "").split(":")[0] in {"jobq", str(IMAGE_UID)}, config
    result = podman("healthcheck", "run", served.name, check=False)
    assert result.returncode == 0, (result.stdout, result.stderr)


def _wait_parked(served: Container) -> None:
    """Polls /metrics until the instance reports a claim long-polling."""
    deadline = time.monotonic() + 10
    headers = {"Authorization": f"Bearer {served.key}"}
    while time.monotonic() < deadline:
        text = httpx.get(f"{served.base_url}/metrics", headers=headers, timeout=5).text
        if "jobq_claims_waiting 1.0" in text:
            return
        time.sleep(0.05)
    raise AssertionError("the claim never parked")


def _parked_claim(url: str, key: str, outcome: list[object]) -> None:
    try:
        response = httpx.post(
            f"{url}/v1/claim",
            json={"worker_id": "image-test", "queues": ["idle"], "wait_seconds": 20},
            headers={"Authorization": f"Bearer {key}"},
            timeout=30,
        )
        outcome.append(response.status_code)
        outcome.append(response.json())
    except httpx.HTTPError as exc:
        outcome.append(exc)


def _exit_code(name: str) -> int:
    return int(podman("inspect", "--format", "{{.State.ExitCode}}", name).stdout.strip())


def test_sigterm_stops_within_the_grace_with_status_0(served: Container) -> None:
    """SIGTERM (the image's STOPSIGNAL) answers a parked long-poll and exits 0 well within 15 s."""
    outcome: list[object] = []
    claim = threading.Thread(target=_parked_claim, args=(served.base_url, served.key, outcome))
    claim.start()
    _wait_parked(served)  # nothing in the queue: the claim would wait 20 s
    started = time.monotonic()
    podman("stop", "--time", str(STOP_GRACE_SECONDS), served.name, timeout=STOP_GRACE_SECONDS + 30)
    elapsed = time.monotonic() - started
    claim.join(timeout=10)
    assert outcome[:2] == [200, {"jobs": []}], outcome
    assert _exit_code(served.name) == 0, podman("logs", served.name, check=False).stderr
    assert elapsed < STOP_GRACE_SECONDS, f"stopping took {elapsed:.1f} s"
