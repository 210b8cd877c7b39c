"""The TypeScript and Go clients' own test suites, run against a real ``jobq serve``.

Each suite reaches the service through ``JOBQ_URL`` and a second one with authentication on
through ``JOBQ_AUTH_URL`` and its keys. Also checked here: the TypeScript client's generated types
equal what ``openapi-typescript`` makes of the committed ``openapi.json`` (as the spec itself is
checked against the app), and the Go code is gofmt-clean and passes ``go vet``.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest

from tests.contract.conftest import KeyedService
from tests.contract.drivers import (
    GO_DIR,
    TYPESCRIPT_DIR,
    build_typescript,
    go_binary,
    node_binary,
    npm_command,
    unavailable,
)
from tests.processes import JobqServer

pytestmark = pytest.mark.acceptance

SUITE_TIMEOUT_SECONDS = 300


def suite_env(service: JobqServer, keyed: KeyedService, extra: dict[str, str]) -> dict[str, str]:
    return {
        **os.environ,
        "JOBQ_URL": service.url,
        "JOBQ_AUTH_URL": keyed.server.url,
        "JOBQ_AUTH_PRODUCER_KEY": keyed.producer_key,
        "JOBQ_AUTH_VIEWER_KEY": keyed.viewer_key,
        **extra,
    }


async def run(argv: Sequence[str], cwd: Path, env: dict[str, str]) -> str:
    """Runs a suite; fails with its output unless it exits 0; answers the output."""
    done = await asyncio.to_thread(
        subprocess.run,
        list(argv),
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=SUITE_TIMEOUT_SECONDS,
        check=False,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"{' '.join(argv)} exited {done.returncode}:\n{output[-12000:]}"
    return output


async def test_the_typescript_client_suite_passes(
    service: JobqServer, keyed_service: KeyedService
) -> None:
    build_typescript()
    node = node_binary()
    path = {"PATH": f"{Path(node).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    output = await run(
        [*npm_command(node), "test"], TYPESCRIPT_DIR, suite_env(service, keyed_service, path)
    )
    assert "# fail 0" in output and "# pass " in output, output[-4000:]


async def test_the_typescript_types_are_generated_from_the_committed_openapi() -> None:
    build_typescript()  # installs openapi-typescript
    node = node_binary()
    path = {"PATH": f"{Path(node).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    await run([*npm_command(node), "run", "check-types"], TYPESCRIPT_DIR, {**os.environ, **path})


async def test_the_go_client_suite_passes(service: JobqServer, keyed_service: KeyedService) -> None:
    go = go_binary()
    if go is None:
        unavailable("no go command: apt-get install golang-go (Go 1.19 or newer)")
        return
    offline = {"GOFLAGS": "-mod=mod", "GOPROXY": "off"}  # the standard library only
    unformatted = await run([str(Path(go).parent / "gofmt"), "-l", "."], GO_DIR, dict(os.environ))
    assert unformatted.strip() == "", f"not gofmt-clean:\n{unformatted}"
    await run([go, "vet", "./..."], GO_DIR, {**os.environ, **offline})
    output = await run(
        [go, "test", "-count=1", "./..."],
        GO_DIR,
        suite_env(service, keyed_service, offline),
    )
    assert "ok " in output and "FAIL" not in output, output[-4000:]
