"""A newcomer's first `jobq serve` shows jobq's own few lines; the embedded server's only on asking."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.processes import JobqServer, ProcessRegistry, clean_environment, free_port

pytestmark = pytest.mark.acceptance

CHATTER = ("initdb", "pg_ctl", "creating subdirectories", "Running upgrade", "RuntimeDirWarning")


async def _first_start(processes: ProcessRegistry, tmp_path: Path, *args: str) -> str:
    env = clean_environment({"JOBQ_DATA_DIR": str(tmp_path / "data")})
    env.pop("DATABASE_URL", None)
    server = JobqServer(
        name="fresh",
        port=free_port(),
        env=env,
        log_path=tmp_path / "serve.log",
        extra_args=args,
    )
    processes.children.append(server)
    await server.wait_ready(60)
    server.send_signal(signal.SIGTERM)
    assert await server.wait_exit(20) == 0
    return server.log_text(tail=100_000)


async def test_first_start_on_the_embedded_server_is_quiet(
    processes: ProcessRegistry, tmp_path: Path
) -> None:
    output = await _first_start(processes, tmp_path)
    assert "embedded PostgreSQL created in" in output and "jobq serving on" in output
    assert not [word for word in CHATTER if word in output], output
    jobq_lines = [line for line in output.splitlines() if "uvicorn" not in line.lower()]
    assert len(jobq_lines) <= 15, output


async def test_verbose_shows_the_embedded_servers_output(
    processes: ProcessRegistry, tmp_path: Path
) -> None:
    output = await _first_start(processes, tmp_path, "--verbose")
    assert "initdb" in output and "Running upgrade" in output


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"JOBQ_PORT": "abc"}, "JOBQ_PORT='abc'"),
        ({"JOBQ_DB_POOL_SIZE": "0"}, "JOBQ_DB_POOL_SIZE='0'"),
        ({"JOBQ_LOG_LEVEL": "loud"}, "JOBQ_LOG_LEVEL='loud'"),
    ],
)
@pytest.mark.parametrize("command", ["serve", "migrate"])
def test_an_invalid_setting_stops_the_start_with_one_line_naming_it(
    command: str, env: dict[str, str], named: str
) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "app.cli", command],
        env=clean_environment(env),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("jobq: invalid setting ") and named in lines[0], lines[0]
    assert "Traceback" not in done.stderr and done.stdout == ""
