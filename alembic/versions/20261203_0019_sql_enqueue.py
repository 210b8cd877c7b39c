"""Enqueue inside the producer's own transaction: jobq.enqueue()

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-03

- Schema ``jobq``, holding what a service sharing jobq's database may call, and nothing else.
- ``jobq.enqueue(queue, type, payload, ...)``: inserts one job as ``POST /v1/jobs`` does, with
  the same validation (each refusal is SQLSTATE 22023 naming the parameter in its message and
  in the error's ``column`` field), inside the caller's transaction: the job exists if and only
  if that transaction commits. ``SECURITY DEFINER``, so the caller needs no right on ``jobs``;
  ``EXECUTE`` is revoked from PUBLIC and granted to the role ``jobq_producer`` (made here when
  the migrating role may create roles), which a service's own role joins
  (``GRANT jobq_producer TO shop``). An idempotency key that exists answers its job's id when
  the arguments are the same, and is refused (23505) when they differ, as the API does.
- ``jobq.enqueue_limits``: the bounds the function checks (queue name, type and key lengths,
  payload size) and the defaults it applies (attempts, lease); one row, written by each
  ``jobq serve`` at start-up from its settings, so the function and the API agree.
- A due job is announced on ``jobq_wakeup`` (``pg_notify``, sent at commit, dropped on
  rollback), so long-polling claims on every instance wake at once; ``wake => false`` leaves the
  job to the claims' own backstop poll and spares the commit the notification's lock.

Rolling deploys: nothing older calls the function; instances on 0018's code neither write the
limits row (the migration's defaults stay) nor recognise the function's wake-ups as such (they
wake their waiters all the same).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0019"
down_revision: str | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

ROLE = "jobq_producer"
SIGNATURE = (
    "jobq.enqueue(text, text, jsonb, integer, timestamptz, double precision, integer, integer, "
    "integer, text, text, text, boolean)"
)

# The API's bounds as of this release (app/domain/bounds.py, app/settings.py defaults); a
# migration keeps its own copy.
_LIMITS = """
CREATE TABLE jobq.enqueue_limits (
    id boolean PRIMARY KEY DEFAULT true CHECK (id),
    queue_name_max_chars int NOT NULL DEFAULT 128,
    type_max_chars int NOT NULL DEFAULT 255,
    idempotency_key_max_chars int NOT NULL DEFAULT 255,
    concurrency_key_max_chars int NOT NULL DEFAULT 255,
    payload_max_bytes int NOT NULL DEFAULT 1048576,
    max_attempts_default int NOT NULL DEFAULT 10,
    lease_seconds_default int NOT NULL DEFAULT 30,
    updated_at timestamptz NOT NULL DEFAULT now()
)
"""

_ENQUEUE = """
CREATE FUNCTION jobq.enqueue(
    queue text,
    type text,
    payload jsonb DEFAULT 'null',
    priority integer DEFAULT 0,
    run_at timestamptz DEFAULT NULL,
    delay_seconds double precision DEFAULT NULL,
    max_attempts integer DEFAULT NULL,
    lease_seconds integer DEFAULT NULL,
    timeout_seconds integer DEFAULT NULL,
    idempotency_key text DEFAULT NULL,
    concurrency_key text DEFAULT NULL,
    traceparent text DEFAULT NULL,
    wake boolean DEFAULT true
) RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = {schema}, pg_temp
AS $fn$
#variable_conflict use_column
DECLARE
    lim jobq.enqueue_limits;
    due timestamptz;
    fingerprint text;
    new_id bigint;
    existing record;
BEGIN
    SELECT * INTO lim FROM jobq.enqueue_limits;
    IF NOT FOUND THEN
        lim := ROW(true, 128, 255, 255, 255, 1048576, 10, 30, now());
    END IF;
    IF enqueue.queue IS NULL OR enqueue.queue !~ '^[A-Za-z0-9][A-Za-z0-9_.:-]*$'
       OR length(enqueue.queue) > lim.queue_name_max_chars THEN
        RAISE EXCEPTION 'jobq.enqueue: queue: a letter or digit, then letters, digits, _ . : -, at most % characters', lim.queue_name_max_chars
            USING ERRCODE = '22023', COLUMN = 'queue';
    END IF;
    IF enqueue.type IS NULL OR length(enqueue.type) NOT BETWEEN 1 AND lim.type_max_chars THEN
        RAISE EXCEPTION 'jobq.enqueue: type: 1 to % characters', lim.type_max_chars
            USING ERRCODE = '22023', COLUMN = 'type';
    END IF;
    IF octet_length(COALESCE(enqueue.payload, 'null'::jsonb)::text) > lim.payload_max_bytes THEN
        RAISE EXCEPTION 'jobq.enqueue: payload: at most % bytes as JSON text', lim.payload_max_bytes
            USING ERRCODE = '22023', COLUMN = 'payload';
    END IF;
    IF enqueue.priority IS NULL THEN
        RAISE EXCEPTION 'jobq.enqueue: priority: an integer, not null'
            USING ERRCODE = '22023', COLUMN = 'priority';
    END IF;
    IF enqueue.run_at IS NOT NULL AND enqueue.delay_seconds IS NOT NULL THEN
        RAISE EXCEPTION 'jobq.enqueue: run_at: give run_at or delay_seconds, not both'
            USING ERRCODE = '22023', COLUMN = 'run_at';
    END IF;
    IF enqueue.run_at IS NOT NULL AND NOT (enqueue.run_at >= '1970-01-01 00:00:00+00'
                                          AND enqueue.run_at < '9000-01-01 00:00:00+00') THEN
        RAISE EXCEPTION 'jobq.enqueue: run_at: must lie between 1970-01-01 and 9000-01-01 (exclusive) in UTC'
            USING ERRCODE = '22023', COLUMN = 'run_at';
    END IF;
    IF enqueue.delay_seconds IS NOT NULL AND NOT (enqueue.delay_seconds >= 0
                                                 AND enqueue.delay_seconds <= {delay_max}) THEN
        RAISE EXCEPTION 'jobq.enqueue: delay_seconds: 0 to {delay_max}'
            USING ERRCODE = '22023', COLUMN = 'delay_seconds';
    END IF;
    IF enqueue.max_attempts IS NOT NULL AND enqueue.max_attempts NOT BETWEEN 1 AND {attempts_max} THEN
        RAISE EXCEPTION 'jobq.enqueue: max_attempts: 1 to {attempts_max}'
            USING ERRCODE = '22023', COLUMN = 'max_attempts';
    END IF;
    IF enqueue.lease_seconds IS NOT NULL AND enqueue.lease_seconds NOT BETWEEN 1 AND {lease_max} THEN
        RAISE EXCEPTION 'jobq.enqueue: lease_seconds: 1 to {lease_max}'
            USING ERRCODE = '22023', COLUMN = 'lease_seconds';
    END IF;
    IF enqueue.timeout_seconds IS NOT NULL AND enqueue.timeout_seconds NOT BETWEEN 1 AND {timeout_max} THEN
        RAISE EXCEPTION 'jobq.enqueue: timeout_seconds: 1 to {timeout_max}'
            USING ERRCODE = '22023', COLUMN = 'timeout_seconds';
    END IF;
    IF enqueue.idempotency_key IS NOT NULL
       AND length(enqueue.idempotency_key) NOT BETWEEN 1 AND lim.idempotency_key_max_chars THEN
        RAISE EXCEPTION 'jobq.enqueue: idempotency_key: 1 to % characters', lim.idempotency_key_max_chars
            USING ERRCODE = '22023', COLUMN = 'idempotency_key';
    END IF;
    IF enqueue.concurrency_key IS NOT NULL
       AND length(enqueue.concurrency_key) NOT BETWEEN 1 AND lim.concurrency_key_max_chars THEN
        RAISE EXCEPTION 'jobq.enqueue: concurrency_key: 1 to % characters', lim.concurrency_key_max_chars
            USING ERRCODE = '22023', COLUMN = 'concurrency_key';
    END IF;

    due := COALESCE(enqueue.run_at,
                    now() + make_interval(secs => COALESCE(enqueue.delay_seconds, 0)));
    IF enqueue.idempotency_key IS NOT NULL THEN
        -- What a replay must repeat: every argument but the key (and wake, which is not the job's).
        fingerprint := 'sql:' || md5(jsonb_build_array(
            enqueue.queue, enqueue.type, enqueue.payload, enqueue.priority, enqueue.run_at,
            enqueue.delay_seconds, enqueue.max_attempts, enqueue.lease_seconds,
            enqueue.timeout_seconds, enqueue.concurrency_key)::text);
    END IF;

    INSERT INTO jobs (queue, type, payload, priority, status, max_attempts, lease_seconds,
                      timeout_seconds, run_at, idempotency_key, idempotency_hash,
                      concurrency_key, traceparent)
    VALUES (enqueue.queue, enqueue.type, COALESCE(enqueue.payload, 'null'::jsonb),
            enqueue.priority,
            CASE WHEN due > now() THEN 'scheduled' ELSE 'pending' END,
            COALESCE(enqueue.max_attempts, lim.max_attempts_default),
            COALESCE(enqueue.lease_seconds, lim.lease_seconds_default),
            enqueue.timeout_seconds, due, enqueue.idempotency_key, fingerprint,
            enqueue.concurrency_key,
            CASE WHEN enqueue.traceparent ~ '^00-[0-9a-f]{{32}}-[0-9a-f]{{16}}-[0-9a-f]{{2}}$'
                      AND enqueue.traceparent !~ '^00-0{{32}}-' AND enqueue.traceparent !~ '-0{{16}}-'
                 THEN enqueue.traceparent END)
    ON CONFLICT (queue, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING id INTO new_id;

    IF new_id IS NULL THEN
        SELECT j.id, j.idempotency_hash INTO existing
        FROM jobs j
        WHERE j.queue = enqueue.queue AND j.idempotency_key = enqueue.idempotency_key;
        IF existing.idempotency_hash IS DISTINCT FROM fingerprint THEN
            RAISE EXCEPTION 'jobq.enqueue: idempotency_key: already used by job % with other arguments', existing.id
                USING ERRCODE = '23505', COLUMN = 'idempotency_key';
        END IF;
        RETURN existing.id;
    END IF;
    IF enqueue.wake AND due <= now() THEN
        -- Sent when the caller commits, never on rollback; "sql" is no instance's id.
        PERFORM pg_notify('jobq_wakeup', 'sql 1 ' || enqueue.queue);
    END IF;
    RETURN new_id;
END
$fn$
"""

_ROLE = f"""
DO $do$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{ROLE}') THEN
        CREATE ROLE {ROLE} NOLOGIN;
    END IF;
EXCEPTION WHEN duplicate_object OR unique_violation THEN
    NULL;  -- another database of the cluster migrating at the same moment made it
WHEN insufficient_privilege THEN
    RAISE NOTICE 'role {ROLE} not created (no CREATEROLE): grant EXECUTE on jobq.enqueue yourself';
END
$do$
"""

_GRANTS = f"""
DO $do$
BEGIN
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = '{ROLE}') THEN
        GRANT USAGE ON SCHEMA jobq TO {ROLE};
        GRANT EXECUTE ON FUNCTION {SIGNATURE} TO {ROLE};
    END IF;
END
$do$
"""


def upgrade() -> None:
    schema = op.get_bind().execute(sa.text("SELECT current_schema()")).scalar_one()
    op.execute("CREATE SCHEMA jobq")
    op.execute("REVOKE ALL ON SCHEMA jobq FROM PUBLIC")
    op.execute(_LIMITS)
    op.execute("INSERT INTO jobq.enqueue_limits DEFAULT VALUES")
    op.execute(
        _ENQUEUE.format(
            schema='"' + schema.replace('"', '""') + '"',
            delay_max=10 * 366 * 24 * 3600,
            attempts_max=1000,
            lease_max=12 * 3600,
            timeout_max=7 * 24 * 3600,
        )
    )
    op.execute(f"REVOKE ALL ON FUNCTION {SIGNATURE} FROM PUBLIC")
    op.execute(_ROLE)
    op.execute(_GRANTS)


def downgrade() -> None:
    # The role stays: roles belong to the cluster, and other databases may grant it rights.
    op.execute("DROP SCHEMA jobq CASCADE")
