"""Runs the Alembic migrations programmatically (``jobq migrate``, ``jobq serve``, the tests)."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from alembic import command
from alembic.config import Config

# Where the wheel carries alembic.ini and alembic/ (pyproject.toml, force-include).
SHIPPED = "_migrations"
# An editable install or a source checkout: the repository the app package lives in.
CHECKOUT = Path(__file__).resolve().parent.parent


class MigrationsMissingError(RuntimeError):
    """Neither the installed package nor a checkout around it holds the migrations."""


def migrations_home() -> Path:
    """The folder that holds ``alembic.ini`` and, beside it, the ``alembic/`` scripts.

    The package's own copy when installed from a wheel; the repository otherwise. A folder counts
    only with alembic.ini in it: beside an installed app package sits the alembic *library*.
    """
    shipped = files("app").joinpath(SHIPPED, "alembic.ini")
    # Installed packages are plain folders (no zipimport): Alembic needs real paths.
    if shipped.is_file():
        return Path(str(shipped)).parent
    if (CHECKOUT / "alembic.ini").is_file():
        return CHECKOUT
    raise MigrationsMissingError(
        f"jobq's migrations are missing: no {SHIPPED}/alembic.ini in the installed app package "
        f"and no alembic.ini in {CHECKOUT}; reinstall jobq from its wheel or its repository"
    )


def alembic_config(database_url: str) -> Config:
    """An Alembic config for jobq's migrations (see :func:`migrations_home`) and this database."""
    home = migrations_home()
    # alembic.ini's script_location is %(here)s/alembic: the scripts beside the file read.
    config = Config(str(home / "alembic.ini"))
    config.attributes["database_url"] = database_url
    # The caller (jobq's CLI, the tests) has set up logging; alembic.ini's is for the alembic CLI.
    config.attributes["skip_logging_config"] = True
    return config


def upgrade(database_url: str, revision: str = "head") -> None:
    """Migrates the database up to ``revision``."""
    command.upgrade(alembic_config(database_url), revision)


def downgrade(database_url: str, revision: str) -> None:
    """Migrates the database down to ``revision``."""
    command.downgrade(alembic_config(database_url), revision)
