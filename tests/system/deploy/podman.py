"""podman for the deployment tests: one command at a time, with the repository's containers.conf."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[3]
CONTAINERS_CONF = REPO_ROOT / "deploy" / "containers.conf"
BUILD_TIMEOUT_SECONDS = 600.0
RUN_TIMEOUT_SECONDS = 120.0


def podman_env() -> dict[str, str]:
    """This process's environment, with CONTAINERS_CONF naming deploy/containers.conf."""
    env = dict(os.environ)
    env.setdefault("CONTAINERS_CONF", str(CONTAINERS_CONF))
    return env


def podman(
    *args: str, timeout: float = RUN_TIMEOUT_SECONDS, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """Runs one podman command; answers its result (raises with its output when check fails)."""
    result = subprocess.run(
        ["podman", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=podman_env(),
        check=False,
    )
    if check and result.returncode != 0:
        raise AssertionError(
            f"podman {' '.join(args)} exited {result.returncode}\n"
            f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
        )
    return result
