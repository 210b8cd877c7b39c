"""docker-compose.yml, read as data: every service runnable, started in order, healthy, configured.

No container runs here: these checks hold the file to what jobq needs (a database URL for every
jobq process, health checks the start order can wait on, a proxy that outlasts a long-poll).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from app.settings import Settings, setting_default

REPO_ROOT = Path(__file__).resolve().parents[3]
COMPOSE_FILE = REPO_ROOT / "docker-compose.yml"
NGINX_CONF = REPO_ROOT / "deploy" / "nginx.conf"
ENV_EXAMPLE = REPO_ROOT / ".env.example"
CONDITIONS = {"service_healthy", "service_completed_successfully"}
# Environment the jobq image reads that is not a service setting: jobq_client's.
CLIENT_ENV = {"JOBQ_URL", "JOBQ_API_KEY"}
# Compose's own variables (interpolated into the file), which jobq ignores.
COMPOSE_ENV = {"JOBQ_PUBLISH", "JOBQ_IMAGE"}
LONGPOLL_FLOOR_SECONDS = 30


def _compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(COMPOSE_FILE.read_text())
    return data


@pytest.fixture(scope="module")
def services() -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = _compose()["services"]
    return found


def _depends_on(service: dict[str, Any]) -> dict[str, dict[str, Any]]:
    depends = service.get("depends_on", {})
    if isinstance(depends, list):  # the short form: no condition at all
        return {name: {} for name in depends}
    result: dict[str, dict[str, Any]] = depends
    return result


def _one_shots(services: dict[str, dict[str, Any]]) -> set[str]:
    """Services some other service waits on to complete: they run once and exit."""
    return {
        name
        for service in services.values()
        for name, spec in _depends_on(service).items()
        if spec.get("condition") == "service_completed_successfully"
    }


def _argv(service: dict[str, Any]) -> list[str]:
    """The words of the service's entrypoint and command (a ``sh -c`` script split as well)."""
    parts: list[str] = []
    for key in ("entrypoint", "command"):
        value = service.get(key, [])
        for item in [value] if isinstance(value, str) else value:
            parts.extend(str(item).split())
    return parts


def _is_jobq_image(service: dict[str, Any]) -> bool:
    return "build" in service or "jobq" in str(service.get("image", "")).split(":")[0]


def _jobq_servers(services: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Services of the jobq image running the service itself (serve, migrate, keys), no worker."""
    return {
        name: service
        for name, service in services.items()
        if _is_jobq_image(service) and "worker" not in _argv(service)
    }


def _seconds(value: str) -> float:
    match = re.fullmatch(r"(\d+)(ms|s|m)?", value.strip())
    assert match, value
    number, unit = float(match[1]), match[2] or "s"
    return number * {"ms": 0.001, "s": 1, "m": 60}[unit]


def test_every_service_has_an_image_or_a_build(services: dict[str, dict[str, Any]]) -> None:
    assert {"postgres", "migrate", "keys", "proxy", "worker"} <= set(services)
    for name, service in services.items():
        assert "image" in service or "build" in service, name


def test_long_running_services_have_health_checks(services: dict[str, dict[str, Any]]) -> None:
    one_shots = _one_shots(services)
    assert {"migrate", "keys"} <= one_shots
    for name, service in services.items():
        if name in one_shots:
            assert service.get("restart") == "no", f"{name} runs once: restart must be 'no'"
            continue
        test = service.get("healthcheck", {}).get("test")
        assert test, f"{name} runs on but has no health check"
        assert not service["healthcheck"].get("disable"), name


def test_two_api_instances_check_readiness(services: dict[str, dict[str, Any]]) -> None:
    apis = [name for name, service in services.items() if _argv(service) == ["serve"]]
    assert len(apis) >= 2, apis
    for name in apis:
        assert "/readyz" in " ".join(services[name]["healthcheck"]["test"]), name
        assert "ports" not in services[name], f"{name}: only the proxy publishes a port"


def test_every_jobq_process_has_its_database_url(services: dict[str, dict[str, Any]]) -> None:
    servers = _jobq_servers(services)
    assert {"migrate", "keys"} <= set(servers)
    for name, service in servers.items():
        env = service.get("environment", {})
        assert isinstance(env, dict), f"{name}: environment as a mapping"
        url = str(env.get("DATABASE_URL", ""))
        # Unset, jobq would start an embedded PostgreSQL inside the container.
        assert url.startswith("postgresql://"), f"{name}: DATABASE_URL={url!r}"
        assert "@postgres:5432/" in url, f"{name}: DATABASE_URL must name the postgres service"
        assert "JOBQ_INSECURE" not in env, f"{name}: serve with keys, never --insecure"


def test_jobq_settings_in_the_file_exist(services: dict[str, dict[str, Any]]) -> None:
    """A misspelt JOBQ_* variable would be ignored silently: every one must be a setting."""
    known = {f"JOBQ_{name.upper()}" for name in Settings.model_fields} | CLIENT_ENV | COMPOSE_ENV
    for name, service in services.items():
        if not _is_jobq_image(service):
            continue
        for variable in service.get("environment", {}):
            if variable.startswith("JOBQ_"):
                assert variable in known, f"{name}: {variable} is no jobq setting"
    for line in ENV_EXAMPLE.read_text().splitlines():
        variable = line.lstrip("# ").partition("=")[0]
        if re.fullmatch(r"JOBQ_[A-Z0-9_]+", variable) and "=" in line:
            assert variable in known, f".env.example: {variable} is no jobq setting"


def test_depends_on_waits_for_health_or_completion(services: dict[str, dict[str, Any]]) -> None:
    for name, service in services.items():
        for dependency, spec in _depends_on(service).items():
            assert dependency in services, f"{name} depends on unknown {dependency}"
            assert spec.get("condition") in CONDITIONS, f"{name} -> {dependency}: {spec}"
            if spec["condition"] == "service_healthy":
                assert "healthcheck" in services[dependency], f"{dependency} has no health check"
    # jobq serve refuses 0.0.0.0 with no keys: the API instances wait for the keys service.
    for name, service in _jobq_servers(services).items():
        if _argv(service) == ["serve"]:
            assert _depends_on(service).get("keys", {}).get("condition") == (
                "service_completed_successfully"
            ), name


def test_stop_grace_outlasts_jobq_shutdown(services: dict[str, dict[str, Any]]) -> None:
    grace = float(setting_default("shutdown_grace_seconds"))
    for name, service in services.items():
        if _argv(service) == ["serve"]:
            assert service.get("stop_signal", "SIGTERM") == "SIGTERM", name
            assert _seconds(service["stop_grace_period"]) >= grace + 5, name


def test_proxy_outlasts_the_longest_long_poll(services: dict[str, dict[str, Any]]) -> None:
    proxy = services["proxy"]
    assert any(str(v).startswith("./deploy/nginx.conf:") for v in proxy["volumes"]), proxy
    conf = NGINX_CONF.read_text()
    # The longest wait_seconds any configuration allows (the setting's upper bound).
    field = Settings.model_fields["longpoll_max_wait_seconds"]
    longest = max(
        [float(m.le) for m in field.metadata if getattr(m, "le", None) is not None]
        + [LONGPOLL_FLOOR_SECONDS]
    )
    for directive in ("proxy_read_timeout", "proxy_send_timeout"):
        values = re.findall(rf"^\s*{directive}\s+(\S+);", conf, re.MULTILINE)
        assert values, f"nginx.conf sets no {directive}"
        for value in values:
            assert _seconds(value) > longest, f"{directive} {value} <= {longest} s"
    assert re.search(r"^\s*proxy_buffering\s+off;", conf, re.MULTILINE)
    upstreams = set(re.findall(r"^\s*server\s+([\w.-]+):8000\b", conf, re.MULTILINE))
    apis = {name for name, service in services.items() if _argv(service) == ["serve"]}
    assert upstreams == apis, (upstreams, apis)
    assert "non_idempotent" not in conf, "a POST (claim, enqueue) must never be retried"


def test_mounted_files_exist(services: dict[str, dict[str, Any]]) -> None:
    for name, service in services.items():
        for volume in service.get("volumes", []):
            source = str(volume).split(":")[0]
            if source.startswith("./"):
                assert (REPO_ROOT / source).is_file(), f"{name}: {source} is missing"


def test_env_example_sets_what_compose_requires() -> None:
    required = set(re.findall(r"\$\{(\w+):\?", COMPOSE_FILE.read_text()))
    assert "POSTGRES_PASSWORD" in required
    example = {
        line.partition("=")[0]
        for line in ENV_EXAMPLE.read_text().splitlines()
        if line and not line.startswith("#")
    }
    assert required <= example, required - example
