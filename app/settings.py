"""Service settings, read from the environment (prefix ``JOBQ_``; the database URL as ``DATABASE_URL``)."""

from __future__ import annotations

from pathlib import Path

from pydantic import AliasChoices, Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    """Everything configurable about one jobq instance; build one per app, never at import time."""

    model_config = SettingsConfigDict(env_prefix="JOBQ_", extra="ignore", frozen=True)

    database_url: str | None = Field(
        default=None,
        validation_alias=AliasChoices("DATABASE_URL", "JOBQ_DATABASE_URL"),
        description="PostgreSQL URL; unset means: start the embedded server under data_dir.",
    )
    data_dir: Path = Path(".jobq")
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)

    db_pool_size: int = Field(default=10, ge=1, le=200)
    db_max_overflow: int = Field(default=0, ge=0, le=200)

    max_body_bytes: int = Field(default=1024 * 1024, ge=1024)
    max_json_depth: int = Field(default=64, ge=2, le=500)

    lease_seconds_default: int = Field(default=30, ge=1, le=43200)
    max_attempts_default: int = Field(default=10, ge=1, le=1000)
    backoff_base_seconds: float = Field(default=1.0, gt=0)
    backoff_cap_seconds: float = Field(default=3600.0, gt=0)
    errors_kept: int = Field(default=20, ge=1, le=1000)
    error_text_max_chars: int = Field(default=4000, ge=100)

    claim_max_jobs: int = Field(default=100, ge=1, le=1000)
    batch_max_jobs: int = Field(default=1000, ge=1, le=10000)
    list_max_limit: int = Field(default=500, ge=1, le=10000)

    longpoll_backstop_seconds: float = Field(default=1.0, gt=0, le=20)
    notify_coalesce_seconds: float = Field(default=0.005, ge=0, le=1)
    wakeup_announce: bool = Field(
        default=True, description="Wake waiters after commits (off only to measure its cost)."
    )
    promoter_interval_seconds: float = Field(default=0.05, gt=0, le=10)

    retention_succeeded_seconds: float = Field(default=7 * 24 * 3600, ge=0)
    retention_cancelled_seconds: float = Field(default=7 * 24 * 3600, ge=0)
    retention_dead_seconds: float = Field(default=30 * 24 * 3600, ge=0)
    pruner_interval_seconds: float = Field(default=60, gt=0)

    maintenance_enabled: bool = True
    reaper_interval_seconds: float = Field(default=1.0, gt=0)
    reaper_batch_size: int = Field(default=500, ge=1, le=10000)

    @model_validator(mode="after")
    def _backoff_cap_not_below_base(self) -> Settings:
        if self.backoff_cap_seconds < self.backoff_base_seconds:
            raise ValueError("backoff_cap_seconds must be >= backoff_base_seconds")
        return self
