"""Set-based cascades, pinned search paths, a validated SQL enqueue, maintenance set-asides

Revision ID: 0025
Revises: 0024
Create Date: 2026-12-07

Issue 40 found three ways in which what reached ``jobs`` could stop work that had nothing to do
with it; this revision closes them in the database.

- **Cascades walk the graph in one statement.** ``jobq_linked_settled`` (the finish trigger of
  jobs with dependents) cancelled each waiting dependent with an UPDATE of its own, which fired
  the same trigger for that dependent: one nesting level per link, so a chain of about 700
  steps overflowed PostgreSQL's stack (``stack depth limit exceeded``). The fail that set it
  off answered 500, and a lease expiry made every reaper batch fail, for every queue. Now one
  recursive query finds every waiting job below the finished one that needs its parents'
  success (each job once), one UPDATE cancels them all, and one more makes the dependents that
  may run now due. The cancelled jobs fire the trigger once more, one level down, where there
  is nothing left to cancel: two levels, whatever the graph. The next job of an ordering key is
  made due only once its own parents have ended as it asks, and a job a parent makes due waits
  while an earlier job of its ordering key is open (the API refuses both together; older rows
  may hold them).
- **No function runs with a caller's objects.** ``jobq.enqueue()`` is ``SECURITY DEFINER``: it
  ran with ``<schema>, pg_temp`` as its path, so a producer role that could create functions
  in that schema (``public`` before PostgreSQL 15) could add an exact-type overload of a
  function the body calls (``jsonb_build_array(text, text, jsonb, ...)``) and have it run with
  the function owner's rights (the migrating role, often a superuser). Every jobq function and
  trigger function now sets ``search_path = pg_catalog, pg_temp`` and names jobq's tables and
  functions with their schema; the triggers, which run with the path of whoever fires them,
  are pinned too. ``jobq.enqueue()`` is owned by ``jobq_definer`` (NOLOGIN, made here when the
  migrating role may create roles), which holds only what the function and the triggers it
  fires need: reading the bounds, inserting jobs, reading a job by its idempotency key, adding
  to the queue counts. Without CREATEROLE the owner stays the migrating role, with a NOTICE.
- **``jobq.enqueue()`` checks the payload as the API does.** It checked only the size: a number
  no client can read back (``1e5000``; jsonb keeps it as 5,001 digits) or nesting past the
  API's depth was stored, and every read of that job answered 500. Refused now (SQLSTATE 22023,
  ``column`` payload), as ``POST /v1/jobs`` refuses them: nesting deeper than the API allows a
  payload (``json_max_depth``, a new column of ``jobq.enqueue_limits`` written by each ``jobq
  serve`` from ``JOBQ_MAX_JSON_DEPTH``, less the body's own level), and a number beyond a
  double's range. Rows that reached the table by other paths are read per row by the service
  (app/stored_json.py).
- **A job cancelled at insert gets its webhook.** A job whose parent had already failed is
  inserted ``cancelled``; the delivery trigger fired only on UPDATE. ``jobs_webhook_inserted``
  (AFTER INSERT, only for such rows) records its delivery too.
- **``maintenance_set_aside``**: a job that makes a maintenance batch fail (the reaper's, the
  promoter's, the pruner's) is retried alone; if it fails alone too it is recorded here, with
  the error, and the loop leaves it out until an operator puts it back
  (``DELETE /v1/maintenance/set-aside/{loop}/{job_id}``), so the rest of the work proceeds.

Rolling deploys: instances on 0024's code run against these functions unchanged (same
signatures, same effects, fewer levels); they do not write ``json_max_depth`` (its default, 64,
is the API's) and never read ``maintenance_set_aside``. Downgrade drops what this revision added
and keeps the rewritten bodies, which serve 0024's code as well.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0025"
down_revision: str | None = "0024"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

DEFINER = "jobq_definer"
ENQUEUE = (
    "jobq.enqueue(text, text, jsonb, integer, timestamptz, double precision, integer, integer, "
    "integer, text, text, text, boolean)"
)
PINNED = "SET search_path = pg_catalog, pg_temp"
# The API's bounds as of this release (app/domain/bounds.py); a migration keeps its own copy.
DELAY_MAX = 10 * 366 * 24 * 3600
ATTEMPTS_MAX = 1000
LEASE_MAX = 12 * 3600
TIMEOUT_MAX = 7 * 24 * 3600
_FINISHED = "('succeeded', 'dead', 'cancelled')"

# Written with __S__ for jobq's schema (where the migration runs), quoted once at upgrade.

_COUNTS = f"""
CREATE OR REPLACE FUNCTION __S__.jobq_counts_inserted() RETURNS trigger LANGUAGE plpgsql
{PINNED} AS $$
BEGIN
    INSERT INTO __S__.queue_counts (queue, status, jobs)
    SELECT queue, status, count(*) FROM jobq_new GROUP BY queue, status;
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION __S__.jobq_counts_updated() RETURNS trigger LANGUAGE plpgsql
SET enable_nestloop = off
{PINNED} AS $$
BEGIN
    WITH moved AS MATERIALIZED (
        SELECT o.queue AS old_queue, o.status AS old_status, n.queue, n.status,
               n.lease_ended_by
        FROM jobq_old o JOIN jobq_new n ON n.id = o.id
        WHERE n.status <> o.status OR n.queue <> o.queue
    ),
    outcomes AS (
        INSERT INTO __S__.queue_throughput (queue, minute, outcome, jobs)
        SELECT queue, date_trunc('minute', now()),
               CASE WHEN status IN {_FINISHED} THEN status ELSE 'failed' END,
               count(*)
        FROM moved
        WHERE status <> old_status
          AND (status IN {_FINISHED}
               OR (old_status = 'running' AND lease_ended_by IN ('fail', 'expire', 'timeout')))
        GROUP BY 1, 2, 3
    )
    INSERT INTO __S__.queue_counts (queue, status, jobs)
    SELECT old_queue, old_status, -count(*) FROM moved GROUP BY 1, 2
    UNION ALL
    SELECT queue, status, count(*) FROM moved GROUP BY 1, 2;
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION __S__.jobq_counts_deleted() RETURNS trigger LANGUAGE plpgsql
{PINNED} AS $$
BEGIN
    INSERT INTO __S__.queue_counts (queue, status, jobs)
    SELECT queue, status, -count(*) FROM jobq_old GROUP BY queue, status;
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION __S__.jobq_counts_truncated() RETURNS trigger LANGUAGE plpgsql
{PINNED} AS $$
BEGIN
    DELETE FROM __S__.queue_counts;
    DELETE FROM __S__.queue_throughput;
    RETURN NULL;
END $$;
"""

_EVENTS = f"""
CREATE OR REPLACE FUNCTION __S__.jobq_events_deleted() RETURNS trigger LANGUAGE plpgsql
{PINNED} AS $$
BEGIN
    DELETE FROM __S__.job_events e USING jobq_old o WHERE e.job_id = o.id;
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION __S__.jobq_events_truncated() RETURNS trigger LANGUAGE plpgsql
{PINNED} AS $$
BEGIN
    TRUNCATE __S__.job_events;
    RETURN NULL;
END $$;
"""

_FLOW = f"""
CREATE OR REPLACE FUNCTION __S__.jobq_flow_counted_updated() RETURNS trigger LANGUAGE plpgsql
{PINNED} AS $$
DECLARE
    moved_keys text[];
    deltas int[];
BEGIN
    -- The common case, no job of the statement holds slots: a scan of each transition table.
    IF NOT EXISTS (SELECT 1 FROM jobq_old WHERE flow_keys IS NOT NULL AND status = 'running')
       AND NOT EXISTS (SELECT 1 FROM jobq_new WHERE flow_keys IS NOT NULL AND status = 'running')
    THEN
        RETURN NULL;
    END IF;
    -- A heartbeat moves nothing and writes nothing.
    SELECT array_agg(key ORDER BY key), array_agg(delta ORDER BY key) INTO moved_keys, deltas
    FROM (
        SELECT key, sum(delta)::int AS delta
        FROM (
            SELECT unnest(flow_keys) AS key, -1 AS delta FROM jobq_old
            WHERE flow_keys IS NOT NULL AND status = 'running'
            UNION ALL
            SELECT unnest(flow_keys), 1 FROM jobq_new
            WHERE flow_keys IS NOT NULL AND status = 'running'
        ) m
        GROUP BY key
        HAVING sum(delta) <> 0
    ) moves;
    IF moved_keys IS NULL THEN
        RETURN NULL;
    END IF;
    INSERT INTO __S__.flow_released (key, n)
    SELECT m.key, -m.delta FROM unnest(moved_keys, deltas) AS m(key, delta) WHERE m.delta < 0;
    IF EXISTS (SELECT 1 FROM unnest(deltas) AS d WHERE d > 0) THEN
        -- Only a claim takes slots, and it holds these rows already: no wait, no deadlock.
        PERFORM 1 FROM __S__.flow_state f
        WHERE f.key IN (SELECT m.key FROM unnest(moved_keys, deltas) AS m(key, delta)
                        WHERE m.delta > 0)
        ORDER BY f.key FOR UPDATE;
        UPDATE __S__.flow_state f
        SET running = f.running + m.delta, updated_at = now()
        FROM unnest(moved_keys, deltas) AS m(key, delta)
        WHERE f.key = m.key AND m.delta > 0;
    END IF;
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION __S__.jobq_flow_counted_deleted() RETURNS trigger LANGUAGE plpgsql
{PINNED} AS $$
BEGIN
    INSERT INTO __S__.flow_released (key, n)
    SELECT key, count(*)::int
    FROM (SELECT unnest(flow_keys) AS key FROM jobq_old
          WHERE flow_keys IS NOT NULL AND status = 'running') m
    GROUP BY key;
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION __S__.jobq_flow_truncated() RETURNS trigger LANGUAGE plpgsql
{PINNED} AS $$
BEGIN
    DELETE FROM __S__.flow_state;
    DELETE FROM __S__.flow_released;
    RETURN NULL;
END $$;
"""

_NOTIFY_AND_WEBHOOK = f"""
CREATE OR REPLACE FUNCTION __S__.jobq_notify_finished() RETURNS trigger LANGUAGE plpgsql
{PINNED} AS $$
BEGIN
    -- The channel app/queue/results.py listens on; the payload is the job id.
    IF TG_OP = 'DELETE' THEN
        PERFORM pg_notify('jobq_finished', OLD.id::text);
    ELSE
        PERFORM pg_notify('jobq_finished', NEW.id::text);
    END IF;
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION __S__.jobq_webhook_finished() RETURNS trigger LANGUAGE plpgsql
{PINNED} AS $$
DECLARE
    delivery uuid := gen_random_uuid();
BEGIN
    -- The outcome as this finish left it: a later retry and finish is a delivery of its own.
    INSERT INTO __S__.webhook_deliveries (id, job_id, url, key_id, body)
    VALUES (delivery, NEW.id, NEW.callback_url, NEW.callback_key_id,
            jsonb_build_object(
                'delivery_id', delivery,
                'event', 'job.finished',
                'job_id', NEW.id,
                'queue', NEW.queue,
                'type', NEW.type,
                'status', NEW.status,
                'result', NEW.result,
                'last_error', NEW.last_error,
                'attempts', NEW.attempts,
                'max_attempts', NEW.max_attempts,
                'finished_at', to_char(COALESCE(NEW.finished_at, now()) AT TIME ZONE 'UTC',
                                       'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')));
    RETURN NULL;
END $$;
"""

# Whether waiting job c may run as far as its parents go: none is open, and none ended dead or
# cancelled unless c runs anyway. Parents are looked at newest first, one index probe each,
# stopping at the first that blocks: parents mostly end in the order they were claimed, so a
# fan-in's finishes each cost a probe or two, not one per parent. A parent the pruner deleted
# no longer blocks.
_PARENTS_ENDED = """NOT EXISTS (
                  SELECT 1
                  FROM generate_subscripts(c.depends_on, 1, true) AS s(i)
                  CROSS JOIN LATERAL (SELECT p.status FROM __S__.jobs p
                                      WHERE p.id = c.depends_on[s.i]) p
                  WHERE p.status <> 'succeeded'
                    AND NOT (c.on_parent_failure = 'run' AND p.status IN ('dead', 'cancelled')))"""

# Whether job c's ordering key lets it run: no other job of its key is due or running.
_KEY_FREE = """(c.ordering_key IS NULL OR NOT EXISTS (
                  SELECT 1 FROM __S__.jobs o
                  WHERE o.queue = c.queue AND o.ordering_key = c.ordering_key AND o.id <> c.id
                    AND o.status IN ('scheduled', 'pending', 'running')))"""

_LINKED = f"""
CREATE OR REPLACE FUNCTION __S__.jobq_linked_inserted() RETURNS trigger LANGUAGE plpgsql
{PINNED} AS $$
DECLARE
    wanted int;
    found_n int;
    failed_n int;
    open_n int;
BEGIN
    IF NEW.depends_on IS NOT NULL THEN
        NEW.depends_on := ARRAY(SELECT DISTINCT d FROM unnest(NEW.depends_on) AS d ORDER BY d);
        wanted := cardinality(NEW.depends_on);
        -- Lock the parents in id order: a parent finishing now is waited for, and its finish
        -- trigger, which runs after this transaction commits, sees this job. Each statement
        -- below reads a snapshot taken after the locks, so it sees that parent finished.
        PERFORM 1 FROM __S__.jobs WHERE id = ANY (NEW.depends_on) ORDER BY id FOR NO KEY UPDATE;
        UPDATE __S__.jobs SET has_dependents = true
        WHERE id = ANY (NEW.depends_on) AND NOT has_dependents;
        SELECT count(*),
               count(*) FILTER (WHERE status IN ('dead', 'cancelled')),
               count(*) FILTER (WHERE status NOT IN {_FINISHED})
          INTO found_n, failed_n, open_n
        FROM __S__.jobs WHERE id = ANY (NEW.depends_on);
        IF found_n < wanted THEN
            RAISE EXCEPTION 'depends_on: % of the % jobs named do not exist', wanted - found_n, wanted
                USING ERRCODE = '23503', COLUMN = 'depends_on';
        END IF;
        IF failed_n > 0 AND NEW.on_parent_failure IS DISTINCT FROM 'run' THEN
            NEW.status := 'cancelled';
            NEW.finished_at := now();
            INSERT INTO __S__.job_events (job_id, kind, data)
            VALUES (NEW.id, 'cancelled', jsonb_build_object(
                'status_before', 'waiting', 'reason', 'a parent ended dead or cancelled'));
        ELSIF open_n > 0 THEN
            NEW.status := 'waiting';
        END IF;
    END IF;
    IF NEW.ordering_key IS NOT NULL AND NEW.status NOT IN {_FINISHED} THEN
        -- The key's row is its lock: enqueues and finishes of one key take turns on it.
        INSERT INTO __S__.ordering_keys AS k (queue, ordering_key)
        VALUES (NEW.queue, NEW.ordering_key)
        ON CONFLICT (queue, ordering_key) DO UPDATE SET updated_at = now();
        IF EXISTS (SELECT 1 FROM __S__.jobs
                   WHERE queue = NEW.queue AND ordering_key = NEW.ordering_key
                     AND status IN ('waiting', 'scheduled', 'pending', 'running')) THEN
            NEW.status := 'waiting';
        END IF;
    END IF;
    RETURN NEW;
END $$;

CREATE OR REPLACE FUNCTION __S__.jobq_linked_reopened() RETURNS trigger LANGUAGE plpgsql
{PINNED} AS $$
BEGIN
    INSERT INTO __S__.ordering_keys AS k (queue, ordering_key) VALUES (NEW.queue, NEW.ordering_key)
    ON CONFLICT (queue, ordering_key) DO UPDATE SET updated_at = now();
    IF EXISTS (SELECT 1 FROM __S__.jobs
               WHERE queue = NEW.queue AND ordering_key = NEW.ordering_key AND id <> NEW.id
                 AND status IN ('waiting', 'scheduled', 'pending', 'running')) THEN
        NEW.status := 'waiting';
    END IF;
    RETURN NEW;
END $$;

CREATE OR REPLACE FUNCTION __S__.jobq_linked_ready(ready_id bigint, ready_queue text,
                                                   ready_status text, after_id bigint)
RETURNS void LANGUAGE plpgsql
{PINNED} AS $$
BEGIN
    INSERT INTO __S__.job_events (job_id, kind, data)
    VALUES (ready_id, 'ready', jsonb_build_object('after', after_id, 'status', ready_status));
    IF ready_status = 'pending' THEN
        PERFORM pg_notify('jobq_wakeup', 'sql 1 ' || ready_queue);
    END IF;
END $$;

CREATE OR REPLACE FUNCTION __S__.jobq_linked_settled() RETURNS trigger LANGUAGE plpgsql
{PINNED} AS $$
DECLARE
    j __S__.jobs;
    ended text;
    doomed_ids bigint[];
    ended_ids bigint[];
    woken_queues text[];
    woken_counts bigint[];
    moved record;
BEGIN
    -- A job the cascade below cancels fires this trigger too, at the end of the cascade's
    -- statement; the cascade does that job's work itself, set-based, so the call returns at
    -- once. Without this, each link of a chain nested one call deeper: a chain of about 700
    -- overflowed PostgreSQL's stack.
    IF current_setting('jobq.cascading', true) = 'on' THEN
        RETURN NULL;
    END IF;
    IF TG_OP = 'DELETE' THEN
        j := OLD;
        ended := 'cancelled';  -- a parent deleted before it finished never succeeds
    ELSE
        j := NEW;
        ended := NEW.status;
    END IF;
    ended_ids := ARRAY[j.id];

    IF j.has_dependents AND ended <> 'succeeded' THEN
        -- Every waiting job below this one that needs its parents' success, found by one walk
        -- of the graph (UNION visits each job once, a diamond too; each step one probe of
        -- ix_jobs_depends_on, which OFFSET 0 keeps from becoming a scan of jobs).
        SELECT array_agg(w.id) INTO doomed_ids
        FROM (
            WITH RECURSIVE doomed(id) AS (
                SELECT c.id FROM __S__.jobs c
                WHERE c.depends_on @> ARRAY[j.id] AND c.status = 'waiting'
                  AND c.on_parent_failure IS DISTINCT FROM 'run'
                UNION
                SELECT k.id
                FROM doomed d
                CROSS JOIN LATERAL (
                    SELECT c.id FROM __S__.jobs c
                    WHERE c.depends_on @> ARRAY[d.id] AND c.status = 'waiting'
                      AND c.on_parent_failure IS DISTINCT FROM 'run'
                    OFFSET 0
                ) k
            )
            SELECT id FROM doomed
        ) w;
        IF doomed_ids IS NOT NULL THEN
            -- One statement cancels them all (each row re-checked as it is locked), and each
            -- records the parent it was cancelled for: this job, or one cancelled with it.
            PERFORM set_config('jobq.cascading', 'on', true);
            WITH cancelled AS (
                UPDATE __S__.jobs c
                SET status = 'cancelled', finished_at = now(), updated_at = now()
                WHERE c.id = ANY (doomed_ids) AND c.status = 'waiting'
                  AND c.on_parent_failure IS DISTINCT FROM 'run'
                RETURNING c.id, c.depends_on
            ),
            recorded AS (
                INSERT INTO __S__.job_events (job_id, kind, data)
                SELECT x.id, 'cancelled', jsonb_build_object(
                           'status_before', 'waiting', 'parent_id', x.parent_id,
                           'parent_status', CASE WHEN x.parent_id = j.id THEN ended
                                                 ELSE 'cancelled' END)
                FROM (SELECT c.id,
                             CASE WHEN c.depends_on @> ARRAY[j.id] THEN j.id
                                  WHEN cardinality(c.depends_on) = 1 THEN c.depends_on[1]
                                  ELSE (SELECT p.id FROM unnest(c.depends_on) AS p(id)
                                        WHERE p.id = ANY (doomed_ids) LIMIT 1) END AS parent_id
                      FROM cancelled c) x
            )
            SELECT ended_ids || COALESCE(array_agg(c.id), '{{}}') INTO ended_ids FROM cancelled c;
            PERFORM set_config('jobq.cascading', '', true);
        END IF;
    END IF;

    IF j.has_dependents THEN
        -- The waiting dependents of every job that ended here are locked first, in id order;
        -- the UPDATE after reads their other parents with a snapshot taken after the locks, so
        -- two parents finishing at once cannot both miss the last one (the second finish waits
        -- for the first, then sees it).
        PERFORM 1 FROM __S__.jobs c
        WHERE c.depends_on && ended_ids AND c.status = 'waiting'
        ORDER BY c.id
        FOR NO KEY UPDATE;
        -- Those that may run now: one UPDATE, announced per queue.
        WITH ready AS (
            UPDATE __S__.jobs c
            SET status = CASE WHEN c.run_at > now() THEN 'scheduled' ELSE 'pending' END,
                updated_at = now()
            WHERE c.depends_on && ended_ids AND c.status = 'waiting'
              AND {_PARENTS_ENDED}
              AND {_KEY_FREE}
            RETURNING c.id, c.queue, c.status, c.depends_on
        ),
        recorded AS (
            INSERT INTO __S__.job_events (job_id, kind, data)
            SELECT r.id, 'ready', jsonb_build_object(
                       'after', CASE WHEN r.depends_on @> ARRAY[j.id] THEN j.id
                                     ELSE (SELECT p.id FROM unnest(r.depends_on) AS p(id)
                                           WHERE p.id = ANY (ended_ids) LIMIT 1) END,
                       'status', r.status)
            FROM ready r
        )
        SELECT array_agg(w.queue), array_agg(w.n) INTO woken_queues, woken_counts
        FROM (SELECT r.queue, count(*) AS n FROM ready r WHERE r.status = 'pending'
              GROUP BY r.queue) w;
        -- Sent at commit, dropped on rollback, as jobq.enqueue() announces (sender "sql").
        PERFORM pg_notify('jobq_wakeup', 'sql ' || w.n || ' ' || w.queue)
        FROM unnest(woken_queues, woken_counts) AS w(queue, n);
    END IF;

    -- The key's head ended (a waiting job leaving changes no turn, so the cascade's jobs
    -- change none): the next one's turn comes when no job of the key is open, and once its
    -- own parents (if any) have ended as it asks. No lock on the key's row here: a finish takes
    -- no lock beyond its own rows, so finishes and enqueues of several keys never wait for
    -- each other in opposite orders. An enqueue committing while this runs may add a waiting
    -- job this does not see; the enqueue's own check after its commit (ordering_key_unstick)
    -- and the promoter's sweep make it due.
    IF j.ordering_key IS NOT NULL AND (TG_OP = 'DELETE' OR OLD.status <> 'waiting') THEN
        IF NOT EXISTS (SELECT 1 FROM __S__.jobs
                       WHERE queue = j.queue AND ordering_key = j.ordering_key
                         AND status IN ('scheduled', 'pending', 'running')) THEN
            UPDATE __S__.jobs c
            SET status = CASE WHEN c.run_at > now() THEN 'scheduled' ELSE 'pending' END,
                updated_at = now()
            WHERE c.id = (SELECT n.id FROM __S__.jobs n
                          WHERE n.queue = j.queue AND n.ordering_key = j.ordering_key
                            AND n.status = 'waiting'
                          ORDER BY n.id LIMIT 1
                          FOR NO KEY UPDATE)
              AND c.status = 'waiting'
              AND (c.depends_on IS NULL OR {_PARENTS_ENDED})
            RETURNING c.id, c.queue, c.status INTO moved;
            IF FOUND THEN
                PERFORM __S__.jobq_linked_ready(moved.id, moved.queue, moved.status, j.id);
            END IF;
        END IF;
    END IF;
    RETURN NULL;
END $$;
"""

# A number beyond a double's range, however it was written: from the half-way point between the
# largest double and 2^1024 up, where reading it as a double rounds to infinity. The API refuses
# the same (app/http/strict_json.py); JavaScript and Go workers read every number as a double,
# and jsonb keeps no trace of how a number was written (1e400 and its 401 digits are one value).
_DOUBLE_OVERFLOW = "179769313486231580793728971405303415079934132710037826936173778980444968292764750946649017977587207096330286416692887910946555547851940402630657488671505820681908902000708383676273854845817711531764475730270069855571366959622842914819860834936475292719074168444365510704342711559699508093042880177904174497792"
_UNREADABLE_NUMBER = f'strict $.** ? (@.type() == "number" && @.abs() >= {_DOUBLE_OVERFLOW})'

_ENQUEUE = f"""
CREATE OR REPLACE FUNCTION jobq.enqueue(
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
{PINNED}
AS $fn$
#variable_conflict use_column
DECLARE
    lim jobq.enqueue_limits;
    body text;
    due timestamptz;
    fingerprint text;
    new_id bigint;
    existing record;
BEGIN
    SELECT * INTO lim FROM jobq.enqueue_limits;
    IF NOT FOUND THEN
        lim := ROW(true, 128, 255, 255, 255, 1048576, 10, 30, now(), 64);
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
    body := COALESCE(enqueue.payload, 'null'::jsonb)::text;
    IF octet_length(body) > lim.payload_max_bytes THEN
        RAISE EXCEPTION 'jobq.enqueue: payload: at most % bytes as JSON text', lim.payload_max_bytes
            USING ERRCODE = '22023', COLUMN = 'payload';
    END IF;
    -- Nesting, as POST /v1/jobs counts it: the body's object is the first level, so a payload
    -- nests one level fewer than json_max_depth. A container at level d needs 2d characters,
    -- so only longer text is walked.
    IF octet_length(body) >= 2 * (lim.json_max_depth - 1)
       AND jsonb_path_exists(enqueue.payload,
                             ('strict $.**{{' || (lim.json_max_depth - 1)
                              || ' to last}} ? (@.type() == "object" || @.type() == "array")')::jsonpath)
    THEN
        RAISE EXCEPTION 'jobq.enqueue: payload: nesting deeper than % levels', lim.json_max_depth - 1
            USING ERRCODE = '22023', COLUMN = 'payload';
    END IF;
    -- A number beyond a double's range has 309 digits or more in jsonb's text (a regular
    -- expression counts to 255 at most: 250 and 59), so only such text is walked.
    IF body ~ '[0-9]{{250}}[0-9]{{59}}' AND jsonb_path_exists(enqueue.payload, '{_UNREADABLE_NUMBER}') THEN
        RAISE EXCEPTION 'jobq.enqueue: payload: a number beyond a double''s range (about 1.8e308), which JSON readers of other languages cannot take'
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
                                                 AND enqueue.delay_seconds <= {DELAY_MAX}) THEN
        RAISE EXCEPTION 'jobq.enqueue: delay_seconds: 0 to {DELAY_MAX}'
            USING ERRCODE = '22023', COLUMN = 'delay_seconds';
    END IF;
    IF enqueue.max_attempts IS NOT NULL AND enqueue.max_attempts NOT BETWEEN 1 AND {ATTEMPTS_MAX} THEN
        RAISE EXCEPTION 'jobq.enqueue: max_attempts: 1 to {ATTEMPTS_MAX}'
            USING ERRCODE = '22023', COLUMN = 'max_attempts';
    END IF;
    IF enqueue.lease_seconds IS NOT NULL AND enqueue.lease_seconds NOT BETWEEN 1 AND {LEASE_MAX} THEN
        RAISE EXCEPTION 'jobq.enqueue: lease_seconds: 1 to {LEASE_MAX}'
            USING ERRCODE = '22023', COLUMN = 'lease_seconds';
    END IF;
    IF enqueue.timeout_seconds IS NOT NULL AND enqueue.timeout_seconds NOT BETWEEN 1 AND {TIMEOUT_MAX} THEN
        RAISE EXCEPTION 'jobq.enqueue: timeout_seconds: 1 to {TIMEOUT_MAX}'
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

    INSERT INTO __S__.jobs (queue, type, payload, priority, status, max_attempts, lease_seconds,
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
        FROM __S__.jobs j
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

# The owner of jobq.enqueue(): what the function and the triggers an insert of it fires need,
# and nothing else. Made only by a role that may create roles; otherwise the NOTICE says so.
_DEFINER = f"""
DO $do$
BEGIN
    BEGIN
        IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{DEFINER}') THEN
            CREATE ROLE {DEFINER} NOLOGIN NOINHERIT;
        END IF;
    EXCEPTION WHEN duplicate_object OR unique_violation THEN
        NULL;  -- another database of the cluster migrating at the same moment made it
    END;
    BEGIN
        IF NOT pg_has_role(current_user, '{DEFINER}', 'USAGE') THEN
            EXECUTE format('GRANT {DEFINER} TO %I', current_user);
        END IF;
    EXCEPTION WHEN duplicate_object OR unique_violation THEN
        NULL;  -- granted at the same moment by another database's migration
    END;
EXCEPTION WHEN insufficient_privilege THEN
    RAISE NOTICE 'role {DEFINER} not made (no CREATEROLE): jobq.enqueue() stays owned by %', current_user;
END
$do$
"""

_DEFINER_RIGHTS = f"""
DO $do$
BEGIN
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = '{DEFINER}')
       AND pg_has_role(current_user, '{DEFINER}', 'USAGE') THEN
        GRANT USAGE ON SCHEMA jobq, __S__ TO {DEFINER};
        GRANT SELECT ON jobq.enqueue_limits TO {DEFINER};
        GRANT INSERT (queue, type, payload, priority, status, max_attempts, lease_seconds,
                      timeout_seconds, run_at, idempotency_key, idempotency_hash,
                      concurrency_key, traceparent)
            ON __S__.jobs TO {DEFINER};
        GRANT SELECT (id, queue, idempotency_key, idempotency_hash) ON __S__.jobs TO {DEFINER};
        GRANT INSERT ON __S__.queue_counts TO {DEFINER};
        -- A new owner needs CREATE on the function's schema (unless a superuser moves it).
        GRANT CREATE ON SCHEMA jobq TO {DEFINER};
        ALTER FUNCTION {ENQUEUE} OWNER TO {DEFINER};
        REVOKE CREATE ON SCHEMA jobq FROM {DEFINER};
    END IF;
END
$do$
"""

# As app/models.py has them before this migration; a migration keeps its own copy.
_ACTIONS_BEFORE = (
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
)
_ACTIONS_AFTER = (*_ACTIONS_BEFORE, "maintenance.put_back")


def _actions_check(actions: Sequence[str]) -> None:
    op.drop_constraint(op.f("ck_audit_log_action"), "audit_log", type_="check")
    op.create_check_constraint(
        op.f("ck_audit_log_action"),
        "audit_log",
        "action IN (" + ", ".join(f"'{a}'" for a in actions) + ")",
    )


_SET_ASIDE_COMMENT = (
    "Jobs a maintenance loop could not move even alone: left out of its batches, with the "
    "error, until an operator puts them back (DELETE /v1/maintenance/set-aside/{loop}/{job_id})."
)


def _schema() -> str:
    name = op.get_bind().execute(sa.text("SELECT current_schema()")).scalar_one()
    return '"' + name.replace('"', '""') + '"'


def upgrade() -> None:
    schema = _schema()

    def run(sql: str) -> None:
        # A prepared statement holds one command: a block of functions runs one at a time.
        head = "CREATE OR REPLACE FUNCTION"
        text = sql.replace("__S__", schema).strip()
        parts = text.split("\n" + head) if text.startswith(head) else [text]
        for index, part in enumerate(parts):
            op.execute((part if index == 0 else head + part).strip().rstrip(";"))

    op.add_column(
        "enqueue_limits",
        sa.Column("json_max_depth", sa.Integer(), server_default=sa.text("64"), nullable=False),
        schema="jobq",
    )
    op.create_table(
        "maintenance_set_aside",
        sa.Column("loop", sa.Text(), nullable=False),
        sa.Column("job_id", sa.BigInteger(), nullable=False),
        sa.Column("queue", sa.Text(), nullable=True),
        sa.Column("error", sa.Text(), nullable=False),
        sa.Column("sqlstate", sa.Text(), nullable=True),
        sa.Column("failures", sa.Integer(), server_default=sa.text("1"), nullable=False),
        sa.Column(
            "first_failed_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column(
            "last_failed_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.PrimaryKeyConstraint("loop", "job_id", name=op.f("pk_maintenance_set_aside")),
        sa.CheckConstraint(
            "loop IN ('reaper', 'promoter', 'pruner')", name=op.f("ck_maintenance_set_aside_loop")
        ),
        comment=_SET_ASIDE_COMMENT,
    )
    _actions_check(_ACTIONS_AFTER)
    for block in (_COUNTS, _EVENTS, _FLOW, _NOTIFY_AND_WEBHOOK, _LINKED):
        run(block)
    run(
        "CREATE TRIGGER jobs_webhook_inserted AFTER INSERT ON __S__.jobs FOR EACH ROW "
        f"WHEN (NEW.callback_url IS NOT NULL AND NEW.status IN {_FINISHED}) "
        "EXECUTE FUNCTION __S__.jobq_webhook_finished()"
    )
    run(_ENQUEUE)
    op.execute(f"REVOKE ALL ON FUNCTION {ENQUEUE} FROM PUBLIC")
    op.execute(_DEFINER)
    run(_DEFINER_RIGHTS)


def downgrade() -> None:
    schema = _schema()
    # The function goes back to the migrating role, as 0019 left it; the role stays (roles
    # belong to the cluster, and other databases may use it).
    op.execute(
        f"""
        DO $do$
        BEGIN
            EXECUTE format('ALTER FUNCTION {ENQUEUE} OWNER TO %I', current_user);
            IF EXISTS (SELECT FROM pg_roles WHERE rolname = '{DEFINER}') THEN
                REVOKE ALL ON {schema}.jobs, {schema}.queue_counts FROM {DEFINER};
                REVOKE ALL ON jobq.enqueue_limits FROM {DEFINER};
                REVOKE ALL ON SCHEMA jobq, {schema} FROM {DEFINER};
            END IF;
        END
        $do$
        """
    )
    op.execute(f"DROP TRIGGER jobs_webhook_inserted ON {schema}.jobs")
    op.drop_table("maintenance_set_aside")
    op.execute("DELETE FROM audit_log WHERE action = 'maintenance.put_back'")
    _actions_check(_ACTIONS_BEFORE)
    op.drop_column("enqueue_limits", "json_max_depth", schema="jobq")
