"""Service settings, read from the environment (prefix ``JOBQ_``; the database URL as ``DATABASE_URL``).

This class is the one source of every default and configurable limit: the loops' configs take
their defaults from it (:func:`setting_default`), and the request models the API validates and
documents in OpenAPI are built from an instance of it (``app/api/schemas.py``). What the storage
itself cannot hold (column ranges, the window of instants) is in ``app/domain/bounds.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import AliasChoices, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from app.domain.bounds import BACKOFF_CAP_SECONDS_MAX, LEASE_SECONDS_MAX, MAX_ATTEMPTS_MAX
from app.domain.cron import CATCH_UP_MAX
from app.domain.webhooks import parse_networks


class Settings(BaseSettings):
    """Everything configurable about one jobq instance; build one per app, never at import time."""

    model_config = SettingsConfigDict(env_prefix="JOBQ_", extra="ignore", frozen=True)

    database_url: str | None = Field(
        default=None,
        validation_alias=AliasChoices("DATABASE_URL", "JOBQ_DATABASE_URL"),
        description="PostgreSQL URL; unset means: start the embedded server under data_dir.",
    )
    direct_database_url: str | None = Field(
        default=None,
        validation_alias=AliasChoices("JOBQ_DIRECT_DATABASE_URL", "DIRECT_DATABASE_URL"),
        description=(
            "PostgreSQL URL that reaches the server itself, for the control connection (LISTEN, "
            "leader lock) and migrations, when DATABASE_URL goes through a transaction-mode "
            "pooler; unset: DATABASE_URL."
        ),
    )
    data_dir: Path = Field(
        default=Path(".jobq"), description="Where the embedded server keeps its data (pgdata/)."
    )
    host: str = Field(default="127.0.0.1", description="Listen address (also --host).")
    port: int = Field(default=8000, ge=0, le=65535, description="Listen port (also --port).")
    workers: int = Field(
        default=1, ge=1, le=64, description="Server processes sharing the port (also --workers)."
    )
    instance_name: str | None = Field(
        default=None,
        min_length=1,
        max_length=200,
        description="This instance's name on the leases it grants; unset: <hostname>:<pid>.",
    )

    db_pool_size: int = Field(
        default=10, ge=1, le=200, description="Connections for enqueue, claim and lease calls."
    )
    db_read_pool_size: int = Field(
        default=3, ge=1, le=200, description="Connections for reads, ops actions and the loops."
    )
    db_max_overflow: int = Field(
        default=0,
        ge=0,
        le=200,
        description="Extra read connections opened under load, then closed.",
    )
    db_pool_timeout_seconds: float = Field(
        default=10, gt=0, le=300, description="How long a request waits for a free connection."
    )
    db_connect_timeout_seconds: float = Field(
        default=5,
        gt=0,
        le=300,
        description=(
            "How long a connection attempt waits for each host DATABASE_URL lists before the "
            "next (after a failover, a dead primary may never answer)."
        ),
    )
    db_statement_cache: bool = Field(
        default=True,
        description=(
            "Cache prepared statements per connection; false behind PgBouncer in transaction "
            "pool mode (statements are then prepared unnamed on every call)."
        ),
    )
    shutdown_grace_seconds: float = Field(
        default=10, ge=0, le=3600, description="How long open requests may finish after SIGTERM."
    )
    # Whoever closes an idle connection must be the side that never sends on it next: a client or
    # proxy that sends a request just as the server closes gets a reset (a 502 behind nginx, which
    # does not retry a POST). So the server waits longest: above nginx's and cloud load
    # balancers' 60 s and httpx's 5 s pool expiry.
    http_keepalive_seconds: int = Field(
        default=75,
        ge=1,
        le=3600,
        description=(
            "How long an idle HTTP connection is kept open; keep it longer than the idle timeout "
            "of every proxy and client pool in front (nginx upstream keepalive_timeout, a load "
            "balancer's idle timeout)."
        ),
    )

    # Security.
    insecure: bool = Field(
        default=False,
        description="Serve a non-loopback address with no API keys made (also --insecure).",
    )
    auth_failures_per_minute: int = Field(
        default=30,
        ge=1,
        le=100_000,
        description="Failed authentications per client address per minute before 429.",
    )
    auth_refresh_seconds: float = Field(
        default=10,
        gt=0,
        le=3600,
        description="How often API keys are reloaded besides on every change notification.",
    )
    cors_origins: str = Field(
        default="",
        description="Comma-separated origins allowed by CORS (empty: CORS off; never with credentials).",
    )
    dashboard_refresh_seconds: int = Field(
        default=5, ge=1, le=3600, description="How often a visible dashboard page refreshes itself."
    )

    # Logs.
    log_level: Literal["critical", "error", "warning", "info", "debug"] = Field(
        default="info", description="Least severe level logged (also --log-level)."
    )
    log_format: Literal["auto", "json", "text"] = Field(
        default="auto",
        description="Log lines as json, text, or auto: text on a terminal, JSON otherwise.",
    )
    # A hot request's two lines cost about a seventh of its CPU (docs/operating/logs.md): by default the
    # routine requests and job changes are counted in the summary line, not written one by one.
    log_access: Literal["off", "errors", "sampled", "all"] = Field(
        default="errors",
        description="Which answered requests get an http.request line: errors (4xx, 5xx and "
        "slow requests), sampled (those and a share of the rest, JOBQ_LOG_SAMPLE_RATE), all, "
        "or off.",
    )
    log_jobs: Literal["off", "errors", "sampled", "all"] = Field(
        default="errors",
        description="Which job state changes get a job.* line: errors (every kind but the "
        "routine enqueued, claimed, completed and webhook_delivered), sampled (those and every "
        "change of a share of the jobs, JOBQ_LOG_SAMPLE_RATE), all, or off.",
    )
    log_sample_rate: float = Field(
        default=0.01,
        ge=0,
        le=1,
        description="Share of the routine requests, and of the jobs, the sampled modes log.",
    )
    log_slow_request_ms: float = Field(
        default=1000,
        gt=0,
        le=3_600_000,
        description="A request answered later than this is logged (a warning) unless "
        "JOBQ_LOG_ACCESS is off; a long poll, this long past the wait it asked for.",
    )
    log_summary_seconds: float = Field(
        default=60,
        ge=0,
        le=86_400,
        description="How often a summary line counts the requests per route and status and the "
        "job state changes since the last one (none when nothing happened); 0: never.",
    )

    # Metrics.
    metrics_refresh_seconds: float = Field(
        default=10,
        gt=0,
        le=3600,
        description="How often /metrics' queue depth and oldest-job gauges are re-read.",
    )
    stuck_after_seconds: float = Field(
        default=600,
        gt=0,
        le=7 * 86_400,
        description="A running job whose progress and checkpoint have not moved this long is "
        "flagged as possibly stuck on the dashboard.",
    )
    metrics_types_max: int = Field(
        default=50,
        ge=1,
        le=10_000,
        description="Distinct job types /metrics labels per instance; later ones count as "
        '"other", so a producer inventing types cannot grow the series without bound.',
    )

    # Requests.
    max_body_bytes: int = Field(
        default=1024 * 1024, ge=1024, description="Largest request body (413 beyond)."
    )
    max_json_depth: int = Field(default=64, ge=2, le=500, description="Deepest JSON nesting.")
    claim_max_jobs: int = Field(default=100, ge=1, le=1000, description="Jobs per claim.")
    claim_max_queues: int = Field(default=100, ge=1, le=1000, description="Queues one claim names.")
    queue_name_max_chars: int = Field(
        default=128, ge=1, le=1024, description="Longest queue name (letters, digits, _ . : -)."
    )
    type_max_chars: int = Field(default=255, ge=1, le=4096, description="Longest job type.")
    worker_id_max_chars: int = Field(default=255, ge=1, le=4096, description="Longest worker id.")
    idempotency_key_max_chars: int = Field(
        default=255, ge=1, le=4096, description="Longest idempotency key."
    )
    batch_max_jobs: int = Field(default=1000, ge=1, le=10000, description="Jobs per batch enqueue.")
    lease_batch_max: int = Field(
        default=1000,
        ge=1,
        le=10000,
        description="Leases per heartbeat / complete / fail / release.",
    )
    list_max_limit: int = Field(default=500, ge=1, le=10000, description="Jobs per listing page.")
    bulk_batch_size: int = Field(
        default=1000,
        ge=1,
        le=100_000,
        description="Jobs a bulk action changes per statement (each batch commits on its own).",
    )
    longpoll_max_wait_seconds: float = Field(
        default=20,
        ge=0,
        le=60,
        description="Longest wait_seconds a claim or a job read (GET /v1/jobs/{id}) may ask for.",
    )
    checkpoint_max_bytes: int = Field(
        default=256 * 1024, ge=1024, le=64 * 1024 * 1024, description="Largest checkpoint (JSON)."
    )
    progress_max_bytes: int = Field(
        default=16 * 1024, ge=256, le=1024 * 1024, description="Largest progress value (JSON)."
    )
    # Composing work (issue 21).
    parent_result_inline_max_bytes: int = Field(
        default=64 * 1024,
        ge=0,
        le=64 * 1024 * 1024,
        description="Largest parent result a claimed job carries inline (as JSON text); a "
        "larger one is left to GET /v1/jobs/{id} (result_by_reference).",
    )
    parent_results_max_bytes: int = Field(
        default=1024 * 1024,
        ge=0,
        le=256 * 1024 * 1024,
        description="Most parent results, in all, one claimed job carries inline (only those "
        "inline count); a result that does not fit what is left goes by reference.",
    )
    workflow_max_steps: int = Field(
        default=1000, ge=1, le=10000, description="Steps per workflow (POST /v1/workflows)."
    )
    depends_on_max: int = Field(
        default=1000,
        ge=1,
        le=10000,
        description="Jobs one job may wait for (depends_on; a batch callback waits for its "
        "whole batch, up to batch_max_jobs).",
    )

    # Coalescing (app/queue/coalesce.py).
    coalesce: bool = Field(
        default=True,
        description="Concurrent requests of one kind (claim, lease calls, single enqueues) share statements.",
    )
    coalesce_max_in_flight: int = Field(
        default=2,
        ge=1,
        le=64,
        description="Statements of one kind running at once; more requests wait and share the next.",
    )
    coalesce_max_items: int = Field(
        default=1000,
        ge=1,
        le=10000,
        description="Items (jobs, leases, claim slots) one shared statement carries.",
    )

    # Jobs.
    lease_seconds_default: int = Field(
        default=30,
        ge=1,
        le=LEASE_SECONDS_MAX,
        description="Lease when neither job nor claim names one.",
    )
    max_attempts_default: int = Field(
        default=10, ge=1, le=MAX_ATTEMPTS_MAX, description="Attempts before a job is dead."
    )
    backoff_base_seconds: float = Field(
        default=1.0,
        gt=0,
        le=BACKOFF_CAP_SECONDS_MAX,
        description="Retry delay ceiling after attempt 1; doubles each attempt.",
    )
    backoff_cap_seconds: float = Field(
        default=3600.0, gt=0, le=BACKOFF_CAP_SECONDS_MAX, description="Largest retry delay ceiling."
    )
    errors_kept: int = Field(default=20, ge=1, le=1000, description="Error history kept per job.")
    error_text_max_chars: int = Field(
        default=4000, ge=100, le=1_000_000, description="Each kept error is cut to this length."
    )

    # Long polling.
    longpoll_backstop_seconds: float = Field(
        default=1.0,
        gt=0,
        le=20,
        description="How often parked claims' queues, and the jobs parked reads wait for, are re-checked.",
    )
    notify_coalesce_seconds: float = Field(
        default=0.005, ge=0, le=1, description="Window in which cross-instance wake-ups merge."
    )
    wakeup_announce: bool = Field(
        default=True, description="Wake waiters after commits (off only to measure its cost)."
    )

    # Background loops.
    maintenance_enabled: bool = Field(
        default=True,
        description="Take part in the election for the reaper, the pruner and the scheduler.",
    )
    election_interval_seconds: float = Field(
        default=1.0, gt=0, le=60, description="How often a follower asks for the leader lock."
    )
    reaper_interval_seconds: float = Field(
        default=1.0, gt=0, description="How often expired leases are reaped (leader only)."
    )
    reaper_batch_size: int = Field(
        default=500, ge=1, le=10000, description="Leases per reap batch."
    )
    promoter_interval_seconds: float = Field(
        default=0.05,
        gt=0,
        le=10,
        description="How often scheduled jobs that came due become pending.",
    )
    promoter_batch_size: int = Field(
        default=1000, ge=1, le=10000, description="Jobs per promotion batch."
    )
    pruner_interval_seconds: float = Field(
        default=60,
        gt=0,
        description="How often finished jobs past retention are deleted (leader only).",
    )
    pruner_batch_size: int = Field(
        default=1000, ge=1, le=10000, description="Jobs per prune batch."
    )
    retention_succeeded_seconds: float = Field(
        default=7 * 24 * 3600,
        ge=0,
        description="How long succeeded jobs (and their idempotency keys) are kept.",
    )
    retention_cancelled_seconds: float = Field(
        default=7 * 24 * 3600, ge=0, description="How long cancelled jobs are kept."
    )
    retention_dead_seconds: float = Field(
        default=30 * 24 * 3600, ge=0, description="How long dead jobs are kept."
    )
    retention_throughput_seconds: float = Field(
        default=2 * 3600, ge=3600, description="How long per-minute outcome counts are kept."
    )
    loop_stall_intervals: float = Field(
        default=3, ge=1, description="A loop not done with a batch for this many intervals..."
    )
    loop_stall_min_seconds: float = Field(
        default=10, gt=0, description="...and at least this long is stalled: /readyz fails."
    )

    # Periodic jobs (app/domain/cron.py, app/queue/schedules.py; the scheduler is app/maintenance/scheduler.py).
    schedules: Path | None = Field(
        default=None,
        description=(
            "A TOML or JSON file of schedules applied at start: each is created or replaced, and "
            "the file's schedules it no longer lists are deleted; an invalid file stops the "
            "start. Unset: none."
        ),
    )
    scheduler_interval_seconds: float = Field(
        default=0.5,
        gt=0,
        le=10,
        description="How often the leader enqueues the due runs of schedules.",
    )
    scheduler_batch_size: int = Field(
        default=100,
        ge=1,
        le=1000,
        description="Schedules per scheduler pass (one transaction with their runs' jobs).",
    )
    schedule_catch_up_max: int = Field(
        default=100,
        ge=0,
        le=CATCH_UP_MAX,
        description="Largest catch_up a schedule may set (missed runs enqueued after downtime).",
    )

    # Completion webhooks (app/domain/webhooks.py, app/queue/webhooks.py, app/maintenance/webhooks.py).
    webhook_secret: SecretStr | None = Field(
        default=None,
        min_length=16,
        description="Signs the webhooks of jobs enqueued without an API key (authentication off, "
        "or schedule runs taking their queue's callback); with keys, each key's own secret "
        "signs. Unset with no keys: callback_url is refused (422).",
    )
    webhook_allowed_networks: str = Field(
        default="",
        description="Comma-separated IP ranges callbacks may reach besides public addresses "
        "(e.g. 10.1.0.0/16, 127.0.0.1/32); loopback, private, link-local, CGNAT and other "
        "special ranges are refused unless listed.",
    )
    webhook_url_max_chars: int = Field(
        default=2048, ge=16, le=65_536, description="Longest callback_url."
    )
    webhook_interval_seconds: float = Field(
        default=0.5,
        gt=0,
        le=60,
        description="How often each instance looks for due webhook deliveries.",
    )
    webhook_batch_size: int = Field(
        default=50, ge=1, le=1000, description="Deliveries one pass takes and sends at once."
    )
    webhook_timeout_seconds: float = Field(
        default=10,
        gt=0,
        le=120,
        description="Longest one delivery attempt may take: lookup, connect, send, answer.",
    )
    webhook_in_flight_seconds: float = Field(
        default=60,
        gt=0,
        le=3600,
        description="A delivery being sent is another instance's again after this long (a "
        "crashed sender's); at least twice the timeout.",
    )
    webhook_backoff_base_seconds: float = Field(
        default=10,
        gt=0,
        le=86_400,
        description="Delay before the second attempt of a delivery; doubles per attempt.",
    )
    webhook_backoff_cap_seconds: float = Field(
        default=3600, gt=0, le=86_400, description="Longest delay between delivery attempts."
    )
    webhook_give_up_seconds: float = Field(
        default=86_400,
        gt=0,
        le=30 * 86_400,
        description="A delivery not accepted within this long of the job's finish is failed.",
    )
    webhook_secret_grace_seconds: float = Field(
        default=86_400,
        ge=0,
        le=30 * 86_400,
        description="After a key's webhook secret is rotated, the previous one also signs "
        "for this long.",
    )
    webhook_retention_seconds: float = Field(
        default=7 * 86_400,
        ge=0,
        description="How long delivered and failed deliveries are kept (the pruner deletes them).",
    )

    @field_validator("webhook_allowed_networks")
    @classmethod
    def _networks(cls, value: str) -> str:
        parse_networks(value)  # raises ValueError naming the bad range
        return value

    @field_validator("log_level", "log_format", "log_access", "log_jobs", mode="before")
    @classmethod
    def _lower_case(cls, value: Any) -> Any:
        return value.lower() if isinstance(value, str) else value

    @model_validator(mode="after")
    def _backoff_cap_not_below_base(self) -> Settings:
        if self.backoff_cap_seconds < self.backoff_base_seconds:
            raise ValueError("backoff_cap_seconds must be >= backoff_base_seconds")
        if self.webhook_backoff_cap_seconds < self.webhook_backoff_base_seconds:
            raise ValueError("webhook_backoff_cap_seconds must be >= webhook_backoff_base_seconds")
        if self.webhook_in_flight_seconds < 2 * self.webhook_timeout_seconds:
            raise ValueError("webhook_in_flight_seconds must be >= 2 x webhook_timeout_seconds")
        return self


def setting_default(name: str) -> Any:
    """The default of one setting: what a loop's config uses when it is built without settings."""
    return Settings.model_fields[name].default


def env_name(name: str) -> str:
    """The environment variable that sets a field of Settings."""
    field = Settings.model_fields[name]
    alias = field.validation_alias
    if isinstance(alias, AliasChoices):
        return str(alias.choices[0])
    return f"JOBQ_{name.upper()}"


def settings_table() -> str:
    """The configuration reference's table of every setting: environment variable, default, meaning."""
    lines = ["| variable | default | meaning |", "|---|---|---|"]
    for name, field in Settings.model_fields.items():
        default = field.default
        shown = "unset" if default is None else f"`{default}`"
        meaning = (field.description or "").replace("|", "\\|")
        lines.append(f"| `{env_name(name)}` | {shown} | {meaning} |")
    return "\n".join(lines)
