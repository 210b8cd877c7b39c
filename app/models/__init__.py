"""The tables: ``jobs`` is the queue, ``queues`` holds per-queue switches, ``api_keys`` the keys, ``audit_log`` who did what. Alembic diffs against these."""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    DateTime,
    Identity,
    Index,
    Integer,
    LargeBinary,
    PrimaryKeyConstraint,
    SmallInteger,
    Table,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, UUID

from app.db import metadata

# Storage parameters (migration 0008): fillfactor 80 and eager autovacuum, for a table whose rows
# are updated several times each. Alembic's autogenerate does not compare them, so they live
# in the migration only.
jobs = Table(
    "jobs",
    metadata,
    Column("id", BigInteger, Identity(always=True), primary_key=True),
    Column("queue", Text, nullable=False),
    Column("type", Text, nullable=False),
    Column("payload", JSONB, nullable=False, server_default=text("'null'::jsonb")),
    Column("priority", Integer, nullable=False, server_default=text("0")),
    Column("status", Text, nullable=False, server_default=text("'pending'")),
    Column("attempts", Integer, nullable=False, server_default=text("0")),
    Column("max_attempts", Integer, nullable=False),
    Column("run_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
    Column("lease_id", UUID(as_uuid=True), nullable=True),
    Column("worker_id", Text, nullable=True),
    # The API key whose worker holds the lease (NULL without authentication): a worker id is
    # only unique within its key, so lease calls check both.
    Column("lease_key_id", BigInteger, nullable=True),
    # Which jobq instance granted the running lease (migration 0010), for GET /v1/workers.
    Column("lease_instance", Text, nullable=True),
    Column("lease_expires_at", DateTime(timezone=True), nullable=True),
    Column("lease_seconds", Integer, nullable=False),
    # The lease length the current claim asked for: what a heartbeat extends by by default.
    Column("lease_granted_seconds", Integer, nullable=True),
    # Which transition ended the current lease: a replay is honoured only as the same transition.
    Column("lease_ended_by", Text, nullable=True),
    # Maximum run time of one attempt; heartbeats cannot extend a lease past it.
    Column("timeout_seconds", Integer, nullable=True),
    Column("idempotency_key", Text, nullable=True),
    # Concurrency keys and rate limits (migration 0011): the job's key, and the flow_state rows
    # its current (or last) attempt holds a running slot in, so the release matches the claim.
    Column("concurrency_key", Text, nullable=True),
    Column("flow_keys", ARRAY(Text), nullable=True),
    # Fingerprint of the enqueue request, to tell a replay from a reuse of the key.
    Column("idempotency_hash", Text, nullable=True),
    Column("result", JSONB, nullable=True),
    Column("last_error", Text, nullable=True),
    Column("errors", JSONB, nullable=False, server_default=text("'[]'::jsonb")),
    Column("checkpoint", JSONB, nullable=True),
    Column("checkpoint_at", DateTime(timezone=True), nullable=True),
    Column("progress", JSONB, nullable=True),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
    Column("started_at", DateTime(timezone=True), nullable=True),
    Column("finished_at", DateTime(timezone=True), nullable=True),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
    # Somebody waits for this job to finish (migration 0012): set by GET /v1/jobs/{id} with
    # wait_seconds, never cleared; row triggers then notify jobq_finished when it finishes (or
    # is deleted unfinished), and only then, so no other job pays for a NOTIFY.
    Column("awaited", Boolean, nullable=False, server_default=text("false")),
    # The schedule and run instant of a job the scheduler enqueued (migration 0015), NULL for
    # every other job: only the scheduler's insert writes them, so no producer can take a run.
    # A trigger's job (POST /v1/schedules/{name}/trigger) has schedule_name alone: not a run.
    Column("schedule_name", Text, nullable=True),
    Column("scheduled_for", DateTime(timezone=True), nullable=True),
    # When a heartbeat last moved the progress or the checkpoint (migration 0017): a running job
    # that has not moved for JOBQ_STUCK_AFTER_SECONDS is flagged as possibly stuck.
    Column("progress_at", DateTime(timezone=True), nullable=True),
    # The W3C trace context of the enqueue (migration 0018), handed to the worker on claim.
    Column("traceparent", Text, nullable=True),
    # Webhooks (migration 0020): where the outcome is POSTed at the finish, the key that signs.
    Column("callback_url", Text, nullable=True),
    Column("callback_key_id", BigInteger, nullable=True),
    # Composing work (migration 0021): the jobs this one waits for and what a parent's failure
    # does to it; has_dependents marks a parent (the finish trigger's WHEN reads it, so jobs
    # without dependents never call it); the ordering key whose jobs run one at a time in
    # enqueue order; the workflow and step a job belongs to.
    Column("depends_on", ARRAY(BigInteger), nullable=True),
    Column("on_parent_failure", Text, nullable=True),
    Column("has_dependents", Boolean, nullable=False, server_default=text("false")),
    Column("ordering_key", Text, nullable=True),
    Column("workflow_id", BigInteger, nullable=True),
    Column("workflow_step", Text, nullable=True),
    CheckConstraint(
        "status IN ('pending', 'scheduled', 'running', 'succeeded', 'dead', 'cancelled', "
        "'waiting')",
        name="status",
    ),
    CheckConstraint("on_parent_failure IN ('cancel', 'run')", name="on_parent_failure"),
    CheckConstraint(
        "lease_ended_by IN ('complete', 'fail', 'release', 'cancel', 'expire', 'timeout')",
        name="lease_ended_by",
    ),
    # The window of instants both PostgreSQL and Python hold (app/domain/bounds.py).
    CheckConstraint(
        "run_at >= '1970-01-01 00:00:00+00' AND run_at < '9000-01-01 00:00:00+00'",
        name="run_at_window",
    ),
    CheckConstraint("attempts >= 0", name="attempts"),
    CheckConstraint("max_attempts >= 1", name="max_attempts"),
    CheckConstraint("lease_seconds BETWEEN 1 AND 43200", name="lease_seconds"),
    CheckConstraint("timeout_seconds BETWEEN 1 AND 604800", name="timeout_seconds"),
    # Claim walks this index in claim order, one queue at a time; it holds only claimable rows,
    # so its size follows the backlog, not the history.
    Index(
        "ix_jobs_claimable",
        "queue",
        text("priority DESC"),
        "run_at",
        "id",
        postgresql_where=text("status = 'pending'"),
    ),
    Index(
        "uq_jobs_queue_idempotency_key",
        "queue",
        "idempotency_key",
        unique=True,
        postgresql_where=text("idempotency_key IS NOT NULL"),
    ),
    # One job per schedule run, however many passes plan it.
    Index(
        "uq_jobs_schedule_run",
        "schedule_name",
        "scheduled_for",
        unique=True,
        postgresql_where=text("schedule_name IS NOT NULL"),
    ),
    # The reaper's scan: running jobs by lease expiry.
    Index(
        "ix_jobs_running_lease_expires_at",
        "lease_expires_at",
        postgresql_where=text("status = 'running'"),
    ),
    # Scheduled jobs waiting out a retry's backoff (migration 0017), per queue: counted and
    # listed apart from jobs scheduled for later. app/domain/states.py RETRYING says the same.
    Index(
        "ix_jobs_retrying",
        "queue",
        "id",
        postgresql_where=text(
            "status = 'scheduled' AND lease_ended_by IN ('fail', 'expire', 'timeout')"
        ),
    ),
    # The promoter's scan: scheduled jobs by due time, moved to pending as they come due.
    Index("ix_jobs_scheduled_run_at", "run_at", postgresql_where=text("status = 'scheduled'")),
    # The pruner's scan: finished jobs by state and age (each state has its own retention).
    Index(
        "ix_jobs_finished_status_finished_at",
        "status",
        "finished_at",
        postgresql_where=text("status IN ('succeeded', 'cancelled', 'dead')"),
    ),
    # Listings, newest first: per queue and state, and per queue, type and state.
    Index("ix_jobs_queue_status_id", "queue", "status", "id"),
    Index("ix_jobs_queue_type_status_id", "queue", "type", "status", "id"),
    # Pending jobs by concurrency key (migration 0011): the claim asks whether an empty
    # bucket's key has jobs waiting in the claimed queues, to say when a token returns.
    Index(
        "ix_jobs_pending_concurrency_key",
        "concurrency_key",
        "queue",
        postgresql_where=text("status = 'pending' AND concurrency_key IS NOT NULL"),
    ),
    # Search (migration 0010): payload containment through GIN, time ranges through BRIN (rows
    # arrive in created_at order, so a few pages summarise millions of them).
    Index(
        "ix_jobs_payload",
        "payload",
        postgresql_using="gin",
        postgresql_ops={"payload": "jsonb_path_ops"},
    ),
    Index("ix_jobs_created_at", "created_at", postgresql_using="brin"),
    # A parent's waiting dependents (migration 0021), found from the parent's id.
    Index(
        "ix_jobs_depends_on",
        "depends_on",
        postgresql_using="gin",
        postgresql_where=text("depends_on IS NOT NULL"),
    ),
    Index(
        "ix_jobs_workflow_id", "workflow_id", "id", postgresql_where=text("workflow_id IS NOT NULL")
    ),
    # An ordering key's open jobs in enqueue order: whether any is open, which one waits next.
    Index(
        "ix_jobs_ordering_open",
        "queue",
        "ordering_key",
        "id",
        postgresql_where=text(
            "ordering_key IS NOT NULL AND status IN ('waiting', 'scheduled', 'pending', 'running')"
        ),
    ),
)

queues = Table(
    "queues",
    metadata,
    Column("name", Text, primary_key=True),
    Column("paused", Boolean, nullable=False, server_default=text("false")),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
    # The callback of the queue's jobs that name none (migration 0020).
    Column("callback_url", Text, nullable=True),
)

# A job's history (migration 0017): a row for each transition its row cannot tell afterwards,
# written by the transition's own statement (app/store/sql/jobs.sql). The happy path (enqueued,
# claimed, completed) writes none: GET /v1/jobs/{id}/events reads those from the job's columns.
# No foreign key (TRUNCATE jobs keeps working); triggers delete a job's events with the job.
JOB_EVENT_KINDS = (
    "claimed",
    "progress",
    "released",
    "failed",
    "lease_expired",
    "timed_out",
    "completed",
    "promoted",
    "cancelled",
    "retried",
    "run_now",
    "webhook",
    "ready",
)

job_events = Table(
    "job_events",
    metadata,
    Column("id", BigInteger, Identity(always=True), primary_key=True),
    Column("job_id", BigInteger, nullable=False),
    Column("at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
    Column("kind", Text, nullable=False),
    # The attempt the event belongs to (a claim's number), NULL for operator actions.
    Column("attempt", Integer, nullable=True),
    # The worker id for a worker's events, the key name (as in audit_log) for an operator's,
    # NULL for the maintenance loops.
    Column("actor", Text, nullable=True),
    Column("actor_key_id", BigInteger, nullable=True),
    Column("instance", Text, nullable=True),
    Column("data", JSONB, nullable=True),
    CheckConstraint("kind IN (" + ", ".join(f"'{k}'" for k in JOB_EVENT_KINDS) + ")", name="kind"),
    Index("ix_job_events_job_id_at", "job_id", "at", "id"),
    # GET /v1/failures: the failures of a recent window, newest first.
    Index(
        "ix_job_events_failures_at",
        "at",
        postgresql_where=text("kind IN ('failed', 'lease_expired', 'timed_out')"),
    ),
)

# Workers seen claiming (migration 0017), by worker id within its API key (0: no key): the queues
# they poll and when they were seen, written by each instance every few seconds from memory.
workers = Table(
    "workers",
    metadata,
    Column("worker_id", Text, nullable=False),
    Column("key_id", BigInteger, nullable=False, server_default=text("0")),
    Column("queues", ARRAY(Text), nullable=False),
    Column("instance", Text, nullable=True),
    Column("first_seen_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
    Column("last_seen_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
    PrimaryKeyConstraint("worker_id", "key_id"),
    Index("ix_workers_last_seen_at", "last_seen_at"),
)

# Per-queue job counts per state, kept exact by triggers on jobs: a journal of signed moves
# (migration 0022), so concurrent statements never wait on one row; sum the rows to read.
# Partitioned by slot (migration 0028): slot 0 holds the folded sums, unique per (queue, status);
# the triggers append to slot 1 or 2, whichever counter_journal_slot names, and
# app/maintenance/counters.py folds the other into slot 0 and empties it with TRUNCATE. The
# partitions, their unique constraints and index live in the migration only.
queue_counts = Table(
    "queue_counts",
    metadata,
    Column("queue", Text, nullable=False),
    Column("status", Text, nullable=False),
    # Always 0 since migration 0022; kept for the previous release's statements.
    Column("shard", SmallInteger, nullable=False, server_default=text("0")),
    Column("jobs", BigInteger, nullable=False),
    # 0 by default: the previous release's fold inserts its sums naming no slot.
    Column("slot", SmallInteger, nullable=False, server_default=text("0")),
    postgresql_partition_by="LIST (slot)",
)

# Per-queue outcomes (succeeded, failed, dead, cancelled) per minute, kept by the same triggers
# as the same kind of journal, in the same slots: sum the rows of a (queue, minute, outcome).
queue_throughput = Table(
    "queue_throughput",
    metadata,
    Column("queue", Text, nullable=False),
    Column("minute", DateTime(timezone=True), nullable=False),
    Column("outcome", Text, nullable=False),
    Column("shard", SmallInteger, nullable=False, server_default=text("0")),
    Column("jobs", BigInteger, nullable=False),
    Column("slot", SmallInteger, nullable=False, server_default=text("0")),
    postgresql_partition_by="LIST (slot)",
)

# The journal slot (1 or 2) the counter triggers append to now: one row, turned over by each fold.
counter_journal_slot = Table(
    "counter_journal_slot",
    metadata,
    Column("id", SmallInteger, nullable=False, server_default=text("1")),
    Column("slot", SmallInteger, nullable=False, server_default=text("1")),
    PrimaryKeyConstraint("id"),
    CheckConstraint("id = 1", name="one"),
    CheckConstraint("slot IN (1, 2)", name="slot"),
)

# API keys (migration 0007): the SHA-256 of each secret, never the secret; revoked, not deleted.
api_keys = Table(
    "api_keys",
    metadata,
    Column("id", BigInteger, Identity(always=True), primary_key=True),
    Column("name", Text, nullable=False),
    Column("role", Text, nullable=False),
    # Queue names or glob patterns the key is limited to; NULL: every queue.
    Column("queues", ARRAY(Text), nullable=True),
    Column("secret_sha256", LargeBinary, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
    Column("revoked_at", DateTime(timezone=True), nullable=True),
    # Signs the key's jobs' webhooks (migration 0020), kept as is; the previous one for a while.
    Column(
        "webhook_secret",
        Text,
        nullable=False,
        server_default=text("jobq_webhook_secret()"),
    ),
    Column("webhook_secret_previous", Text, nullable=True),
    Column("webhook_secret_rotated_at", DateTime(timezone=True), nullable=True),
    CheckConstraint("role IN ('producer', 'worker', 'viewer', 'admin')", name="role"),
    UniqueConstraint("name"),
    UniqueConstraint("secret_sha256"),
)

# What each admin action writes (migration 0009): one row per accepted cancel, retry, pause or
# resume (and queue create or delete, migration 0016), written by the action's own statement, one per bulk action (migration 0010) with its
# filter and count in detail, and one per attempted key create or revoke.
# Never updated; no pruning yet. The actor is copied as text: keys are revoked, never deleted,
# and the CLI and anonymous callers have no key row.
AUDIT_ACTIONS = (
    "job.cancel",
    "job.retry",
    "queue.pause",
    "queue.resume",
    "key.create",
    "key.revoke",
    "bulk.retry",
    "bulk.cancel",
    "bulk.delete",
    "limit.set",
    "limit.delete",
    "schedule.create",
    "schedule.update",
    "schedule.delete",
    "schedule.pause",
    "schedule.resume",
    "queue.create",
    "queue.delete",
    "job.run_now",
    "schedule.trigger",
    "key.rotate_webhook_secret",
    "workflow.cancel",
    "workflow.retry",
    "maintenance.put_back",
)

audit_log = Table(
    "audit_log",
    metadata,
    Column("id", BigInteger, Identity(always=True), primary_key=True),
    Column("at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
    # The acting key's name, "anonymous" (authentication off) or "cli:<OS user>".
    Column("actor", Text, nullable=False),
    Column("actor_key_id", BigInteger, nullable=True),
    Column("action", Text, nullable=False),
    Column("outcome", Text, nullable=False),
    # What it touched: the job (and its queue), the queue, or the key (by name).
    Column("queue", Text, nullable=True),
    Column("job_id", BigInteger, nullable=True),
    Column("key_name", Text, nullable=True),
    # Job status, "paused" / "active", or "live" / "revoked", before and after the action.
    Column("state_before", Text, nullable=True),
    Column("state_after", Text, nullable=True),
    Column("detail", JSONB, nullable=True),
    CheckConstraint(
        "action IN (" + ", ".join(f"'{a}'" for a in AUDIT_ACTIONS) + ")", name="action"
    ),
    CheckConstraint("outcome IN ('changed', 'unchanged', 'refused')", name="outcome"),
    # The listing, newest first, filtered by action or by actor (unfiltered: the primary key).
    Index("ix_audit_log_action_id", "action", "id"),
    Index("ix_audit_log_actor_id", "actor", "id"),
)

# Periodic jobs (migration 0013): one row per schedule, a cron expression or an interval in a time
# zone, and the job each run enqueues. next_run_at is the next due run as an instant (computed in
# app/domain/cron.py); the leader enqueues due runs and advances it in one transaction.
schedules = Table(
    "schedules",
    metadata,
    Column("name", Text, primary_key=True),
    Column("cron", Text, nullable=True),
    Column("interval_seconds", Integer, nullable=True),
    Column("timezone", Text, nullable=False, server_default=text("'UTC'")),
    # The job template; NULL max_attempts / lease_seconds take the service's defaults per run.
    Column("queue", Text, nullable=False),
    Column("type", Text, nullable=False),
    Column("payload", JSONB, nullable=False, server_default=text("'null'::jsonb")),
    Column("priority", Integer, nullable=False, server_default=text("0")),
    Column("max_attempts", Integer, nullable=True),
    Column("lease_seconds", Integer, nullable=True),
    Column("timeout_seconds", Integer, nullable=True),
    Column("concurrency_key", Text, nullable=True),
    # How many missed runs (besides the current one) one pass enqueues after downtime.
    Column("catch_up", Integer, nullable=False, server_default=text("0")),
    Column("paused", Boolean, nullable=False, server_default=text("false")),
    Column("next_run_at", DateTime(timezone=True), nullable=False),
    Column("last_run_at", DateTime(timezone=True), nullable=True),
    # The job of the latest run enqueued; no foreign key: the pruner deletes finished jobs.
    Column("last_job_id", BigInteger, nullable=True),
    # Who wrote the definition: the API, or the JOBQ_SCHEDULES file (which removes its own).
    Column("source", Text, nullable=False, server_default=text("'api'")),
    # Why and since when the scheduler could not plan the schedule (migration 0015); while set,
    # the schedule is parked (no pass locks it) until a change or a resume clears it.
    Column("last_error", Text, nullable=True),
    Column("errored_at", DateTime(timezone=True), nullable=True),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
    CheckConstraint("(cron IS NULL) <> (interval_seconds IS NULL)", name="one_timing"),
    CheckConstraint("name ~ '^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$'", name="name"),
    CheckConstraint("char_length(cron) BETWEEN 1 AND 200", name="cron"),
    CheckConstraint("interval_seconds BETWEEN 1 AND 31622400", name="interval_seconds"),
    CheckConstraint("char_length(timezone) BETWEEN 1 AND 64", name="timezone"),
    CheckConstraint("catch_up BETWEEN 0 AND 1000", name="catch_up"),
    CheckConstraint("max_attempts BETWEEN 1 AND 1000", name="max_attempts"),
    CheckConstraint("lease_seconds BETWEEN 1 AND 43200", name="lease_seconds"),
    CheckConstraint("timeout_seconds BETWEEN 1 AND 604800", name="timeout_seconds"),
    CheckConstraint("source IN ('api', 'file')", name="source"),
    CheckConstraint(
        "next_run_at >= '1970-01-01 00:00:00+00' AND next_run_at < '9000-01-01 00:00:00+00'",
        name="next_run_at_window",
    ),
    # The scheduler's scan: active schedules not in error, by due time.
    Index(
        "ix_schedules_due",
        "next_run_at",
        postgresql_where=text("NOT paused AND errored_at IS NULL"),
    ),
    # Listings of a scoped key's schedules.
    Index("ix_schedules_queue_name", "queue", "name"),
)

# The tables kept in modules of their own, registered on the same metadata (what Alembic diffs).
from app.models.composing import ordering_keys, workflows  # noqa: E402
from app.models.flow import flow_limits, flow_released, flow_state  # noqa: E402
from app.models.maintenance import maintenance_set_aside  # noqa: E402
from app.models.webhooks import webhook_deliveries  # noqa: E402

__all__ = [
    "flow_limits",
    "flow_released",
    "flow_state",
    "maintenance_set_aside",
    "metadata",
    "ordering_keys",
    "webhook_deliveries",
    "workflows",
]
