"""Runs the Alembic migrations programmatically (``jobq migrate``, ``jobq serve``, the tests)."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config

PROJECT_ROOT = Path(__file__).resolve().parent.parent


def alembic_config(database_url: str) -> Config:
    """An Alembic config for the repository's ``alembic/`` folder and this database."""
    config = Config(str(PROJECT_ROOT / "alembic.ini"))
    config.set_main_option("script_location", str(PROJECT_ROOT / "alembic"))
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
