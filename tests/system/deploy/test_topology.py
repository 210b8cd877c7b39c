"""The compose stack's pieces, run together with podman: keys, two API instances, nginx, the worker.

No registry is reachable here, so neither compose nor the official postgres and nginx images
run: the jobq services run from the image built from the Dockerfile with the entrypoints,
mounts and environment docker-compose.yml gives them, nginx (Debian's, in an image made from
the same base) runs ``deploy/nginx.conf`` with the service names and ports rewritten for the
host network, and PostgreSQL is the tests' TCP server. What this proves: the key bootstrap
works and runs once, both instances serve behind the proxy, a long-poll and the dashboard pass
through it, and the example worker finishes jobs enqueued through it.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.processes import free_port
from tests.system.deploy.conftest import Database
from tests.system.deploy.podman import REPO_ROOT, podman

pytestmark = pytest.mark.image

NGINX_IMAGE = "localhost/jobq-test-nginx:cache"
NGINX_CONTAINERFILE = """\
FROM debian:bookworm-slim
LABEL io.jobq.stage=test-nginx
RUN apt-get update && apt-get install -y --no-install-recommends nginx \\
    && rm -rf /var/lib/apt/lists/* /etc/nginx/sites-enabled/*
CMD ["nginx", "-g", "daemon off;"]
"""
READY_TIMEOUT_SECONDS = 60.0
JOBS = 6
IDLE_GAP_SECONDS = 6.0  # longer than uvicorn's default keep-alive of 5 s
TCP_ESTABLISHED = "01"  # the state column of /proc/net/tcp


def _compose_services() -> dict[str, dict[str, Any]]:
    services: dict[str, dict[str, Any]] = yaml.safe_load(
        (REPO_ROOT / "docker-compose.yml").read_text()
    )["services"]
    return services


def _run_flags(service: dict[str, Any], volume: str) -> list[str]:
    """podman flags for a compose service's entrypoint, working dir and mounts."""
    flags: list[str] = []
    for mount in service.get("volumes", []):
        source, _, rest = str(mount).partition(":")
        if source.startswith("./"):
            source = str(REPO_ROOT / source)
        elif source == "keys":
            source = volume
        flags += ["-v", f"{source}:{rest}"]
    if "working_dir" in service:
        flags += ["--workdir", service["working_dir"]]
    entrypoint = service.get("entrypoint")
    if entrypoint:
        flags += ["--entrypoint", entrypoint[0]]
    return flags


def _entrypoint_args(service: dict[str, Any]) -> list[str]:
    # Compose writes a literal $ as $$; podman passes arguments as they are.
    return [str(arg).replace("$$", "$") for arg in service.get("entrypoint", [])[1:]]


def _wait(url: str, what: str) -> None:
    deadline, last = time.monotonic() + READY_TIMEOUT_SECONDS, "no answer"
    while time.monotonic() < deadline:
        try:
            response = httpx.get(url, timeout=2)
            if response.status_code == 200:
                return
            last = f"{response.status_code}"
        except httpx.HTTPError as exc:
            last = repr(exc)
        time.sleep(0.5)
    raise AssertionError(f"{what} never answered 200 at {url} ({last})")


@pytest.fixture(scope="session")
def nginx_image(podman_ready: None, image: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    """Debian's nginx on the jobq base, kept as a cache between runs (like the base image)."""
    if podman("image", "exists", NGINX_IMAGE, check=False).returncode != 0:
        folder = tmp_path_factory.mktemp("nginx-image")
        (folder / "Containerfile").write_text(NGINX_CONTAINERFILE)
        podman(
            "build",
            "--format",
            "docker",
            "--pull=never",
            "--network",
            "host",
            "-t",
            NGINX_IMAGE,
            str(folder),
            timeout=300,
        )
    return NGINX_IMAGE


@dataclass
class Stack:
    """The running stack: the proxy's URL, the admin key and the containers by service name."""

    proxy_url: str
    admin_key: str
    containers: dict[str, str]
    keys_output: list[str]
    api_ports: dict[str, int]


@pytest.fixture(scope="module")
def stack(
    image: str, nginx_image: str, database: Database, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    services = _compose_services()
    run_id = uuid.uuid4().hex[:8]
    volume = f"jobq-test-keys-{run_id}"
    containers: dict[str, str] = {}
    env = ["-e", f"DATABASE_URL={database.url}"]
    podman("volume", "create", volume)
    try:
        migrated = podman("run", "--rm", "--network", "host", *env, image, "migrate")
        assert "migrated to head" in migrated.stdout

        keys = services["keys"]
        keys_output = []
        for _ in range(2):  # the second start must change nothing
            result = podman(
                "run",
                "--rm",
                "--network",
                "host",
                *env,
                *_run_flags(keys, volume),
                image,
                *_entrypoint_args(keys),
            )
            keys_output.append(result.stdout)

        ports = {name: free_port() for name in ("api-1", "api-2", "proxy")}
        for name in ("api-1", "api-2"):
            containers[name] = f"jobq-test-{name}-{run_id}"
            podman(
                "run",
                "--detach",
                "--name",
                containers[name],
                "--network",
                "host",
                "--health-interval",
                "disable",
                *env,
                "-e",
                f"JOBQ_PORT={ports[name]}",
                "-e",
                f"JOBQ_INSTANCE_NAME={name}",
                "-e",
                "JOBQ_LOG_FORMAT=json",
                # An access line per request: the test reads them to see that nginx reached
                # both instances (the default logs only errors and slow requests).
                "-e",
                "JOBQ_LOG_ACCESS=all",
                image,
                *services[name].get("command", []),
            )
        for name in ("api-1", "api-2"):
            _wait(f"http://127.0.0.1:{ports[name]}/readyz", name)

        conf = (REPO_ROOT / "deploy" / "nginx.conf").read_text()
        conf = conf.replace("api-1:8000", f"127.0.0.1:{ports['api-1']}")
        conf = conf.replace("api-2:8000", f"127.0.0.1:{ports['api-2']}")
        conf = conf.replace("listen 8080;", f"listen 127.0.0.1:{ports['proxy']};")
        conf_path: Path = tmp_path_factory.mktemp("nginx") / "default.conf"
        conf_path.write_text(conf)
        containers["proxy"] = f"jobq-test-proxy-{run_id}"
        podman(
            "run",
            "--detach",
            "--name",
            containers["proxy"],
            "--network",
            "host",
            "-v",
            f"{conf_path}:/etc/nginx/conf.d/default.conf:ro",
            nginx_image,
        )
        proxy_url = f"http://127.0.0.1:{ports['proxy']}"
        _wait(f"{proxy_url}/proxy-health", "nginx")

        worker = services["worker"]
        containers["worker"] = f"jobq-test-worker-{run_id}"
        podman(
            "run",
            "--detach",
            "--name",
            containers["worker"],
            "--network",
            "host",
            "--health-interval",
            "disable",
            "-e",
            f"JOBQ_URL={proxy_url}",
            *_run_flags(worker, volume),
            image,
            *_entrypoint_args(worker),
        )
        admin_key = podman(
            "run",
            "--rm",
            "--entrypoint",
            "cat",
            "-v",
            f"{volume}:/var/lib/jobq:ro",
            image,
            "/var/lib/jobq/admin.key",
        ).stdout.strip()
        api_ports = {name: ports[name] for name in ("api-1", "api-2")}
        yield Stack(proxy_url, admin_key, containers, keys_output, api_ports)
    finally:
        for name in containers.values():
            podman("rm", "--force", "--time", "0", name, check=False)
        podman("volume", "rm", "--force", volume, check=False)


def test_keys_are_made_once(stack: Stack) -> None:
    first, second = stack.keys_output
    assert "made the admin key compose-admin" in first, first
    assert stack.admin_key.startswith("jobq_") and stack.admin_key in first
    assert "nothing to do" in second, second


def test_the_worker_finishes_jobs_enqueued_through_the_proxy(stack: Stack) -> None:
    headers = {"Authorization": f"Bearer {stack.admin_key}"}
    with httpx.Client(base_url=stack.proxy_url, headers=headers, timeout=10) as http:
        ids = []
        for n in range(JOBS):
            response = http.post(
                "/v1/jobs", json={"queue": "default", "type": "echo", "payload": {"n": n}}
            )
            assert response.status_code == 201, response.text
            ids.append(response.json()["id"])
        deadline = time.monotonic() + 30
        pending = set(ids)
        while pending and time.monotonic() < deadline:
            for job_id in list(pending):
                job = http.get(f"/v1/jobs/{job_id}").json()
                if job["status"] == "succeeded":
                    assert job["result"]["echo"] == job["payload"], job
                    pending.discard(job_id)
            time.sleep(0.3)
        logs = podman("logs", stack.containers["worker"], check=False)
        assert not pending, f"not done: {sorted(pending)}\n{logs.stdout}\n{logs.stderr}"
    for name in ("api-1", "api-2"):
        logs = podman("logs", stack.containers[name])
        assert "/v1/jobs" in logs.stdout + logs.stderr, f"{name} served nothing through nginx"


def test_long_poll_and_dashboard_pass_through_the_proxy(stack: Stack) -> None:
    started = time.monotonic()
    claim = httpx.post(
        f"{stack.proxy_url}/v1/claim",
        json={"worker_id": "topology-test", "queues": ["idle"], "wait_seconds": 3},
        headers={"Authorization": f"Bearer {stack.admin_key}"},
        timeout=15,
    )
    assert claim.status_code == 200 and claim.json() == {"jobs": []}, claim.text
    assert time.monotonic() - started >= 2.5, "the claim did not wait"
    login = httpx.get(f"{stack.proxy_url}/dashboard/", follow_redirects=True, timeout=10)
    assert login.status_code == 200 and "/dashboard/login" in str(login.url), login.url


def test_the_worker_stops_cleanly_on_sigterm(stack: Stack) -> None:
    name = stack.containers["worker"]
    podman("stop", "--time", "35", name, timeout=60)
    code = podman("inspect", "--format", "{{.State.ExitCode}}", name).stdout.strip()
    assert code == "0", podman("logs", name, check=False).stderr


def _connections_to(port: int) -> set[int]:
    """Local ports of the established TCP connections to 127.0.0.1:``port`` on this host.

    Every container runs on the host's network, so nginx's connections to jobq are listed here.
    """
    found = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, remote, state = line.split()[1:4]
        if state == TCP_ESTABLISHED and int(remote.rpartition(":")[2], 16) == port:
            found.add(int(local.rpartition(":")[2], 16))
    return found


def test_connections_to_jobq_outlive_an_idle_gap_and_nothing_answers_502(stack: Stack) -> None:
    # nginx keeps its idle upstream connections 60 s and jobq 75 s, so after a gap longer than
    # uvicorn's old 5 s the connections nginx left are all still open, and nginx closes them
    # first. (Runs after the worker stopped, so these are the proxy's only requests.)
    with httpx.Client(base_url=stack.proxy_url, timeout=10) as http:
        for n in range(4):
            answer = http.get("/healthz", params={"probe": f"before-{n}"})
            assert answer.status_code == 200, f"{answer.status_code} {answer.text}"
        before = {name: _connections_to(port) for name, port in stack.api_ports.items()}
        time.sleep(IDLE_GAP_SECONDS)  # the idleness is what is tested
        after_gap = {name: _connections_to(port) for name, port in stack.api_ports.items()}
        for n in range(4):
            answer = http.get("/healthz", params={"probe": f"after-{n}"})
            assert answer.status_code == 200, f"{answer.status_code} {answer.text}"
    assert all(before.values()), f"nginx kept no connection to an instance: {before}"
    assert after_gap == before, f"idle connections were closed: {before} -> {after_gap}"
