"""The built wheel on its own: installed into a fresh venv, far from the repository, it migrates."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import sysconfig
from collections.abc import Iterator
from pathlib import Path

import pytest
from alembic.script import ScriptDirectory
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

from app.db import async_url
from app.migrations import alembic_config
from tests.conftest import create_database, drop_database
from tests.processes import REPO_ROOT, clean_environment

STEP_TIMEOUT_SECONDS = 120


def run(argv: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=STEP_TIMEOUT_SECONDS
    )
    assert done.returncode == 0, f"{argv}: {done.stdout}\n{done.stderr}"
    return done


@pytest.fixture
def wheel_venv(tmp_path: Path) -> Path:
    """A fresh venv holding jobq's wheel; its dependencies come from this venv, read-only."""
    env = clean_environment()
    env.pop("PYTHONPATH", None)
    wheels = tmp_path / "wheels"
    run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(wheels), "."],
        REPO_ROOT,
        env,
    )
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", str(venv)], tmp_path, env)
    python = venv / "bin" / "python"
    site = run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        tmp_path,
        env,
    ).stdout.strip()
    # A plain path line: this venv's .pth files (the editable install of jobq) stay unread, and
    # the wheel's own app package comes first.
    Path(site, "dependencies.pth").write_text(sysconfig.get_path("purelib") + "\n")
    (wheel,) = wheels.glob("jobq-*.whl")
    run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "--quiet",
            "--no-deps",
            "--no-index",
            str(wheel),
        ],
        tmp_path,
        env,
    )
    return venv


@pytest.fixture
def empty_database(pg_server_url: str) -> Iterator[str]:
    url = create_database(pg_server_url, prefix="jobq_wheel")
    try:
        yield url
    finally:
        drop_database(pg_server_url, url)


def _package_files(package: Path) -> set[str]:
    return {
        path.relative_to(package).as_posix()
        for path in package.rglob("*")
        if path.is_file()
        and "__pycache__" not in path.parts
        and not any(part.startswith(".") for part in path.relative_to(package).parts)
    }


async def _version(url: str) -> str:
    engine = create_async_engine(async_url(url), poolclass=NullPool)
    try:
        async with engine.connect() as conn:
            return str(
                (await conn.execute(text("SELECT version_num FROM alembic_version"))).scalar_one()
            )
    finally:
        await engine.dispose()


def test_the_installed_wheel_migrates_from_its_own_files(
    wheel_venv: Path, empty_database: str, tmp_path: Path
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = clean_environment({"DATABASE_URL": empty_database})
    env.pop("PYTHONPATH", None)
    where = run(
        [str(wheel_venv / "bin" / "python"), "-c", "import app; print(app.__file__)"],
        elsewhere,
        env,
    ).stdout.strip()
    assert Path(where).is_relative_to(wheel_venv), where
    shipped = _package_files(Path(where).parent)
    assert _package_files(REPO_ROOT / "app") <= shipped  # templates, static files, SQL
    assert {"_migrations/alembic.ini", "_migrations/alembic/env.py"} <= shipped

    migrated = run([str(wheel_venv / "bin" / "jobq"), "migrate"], elsewhere, env)

    assert "migrated to head" in migrated.stdout
    head = ScriptDirectory.from_config(alembic_config(empty_database)).get_current_head()
    assert asyncio.run(_version(empty_database)) == head
    assert os.listdir(elsewhere) == []  # no data folder, no embedded cluster: DATABASE_URL served


def test_the_migrations_folder_never_shadows_the_alembic_library() -> None:
    # The repository's root is on sys.path (an editable install, pytest's rootdir): a package
    # there named alembic would be imported in place of the library.
    import alembic

    assert not (REPO_ROOT / "alembic" / "__init__.py").exists()
    assert alembic.__file__ is not None
    assert not Path(alembic.__file__).is_relative_to(REPO_ROOT / "alembic")
