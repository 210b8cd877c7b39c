-- Named statements for periodic jobs (the schedules table, migration 0013). Each block starts with
-- "-- name: <name>" and one line saying what it does; app/store/schedules.py is the only caller.
-- When a schedule runs is computed in Python (app/queue/schedules.py: cron and time zones), from
-- the database's clock read in the same transaction; what is due and what moves is decided here.
-- The scheduler's statements take an optional :now (NULL: the database's now()), so tests can run
-- a pass exactly at a due time.

-- name: schedule_due
-- Locks at most :batch_size active schedules not in error whose next run is due by :now, earliest first, skipping rows another pass holds; answers them with the clock they were judged by (db_now).
-- Walks ix_schedules_due (active schedules not in error by next_run_at): its size is the
-- schedules, and a pass reads only the due ones. An errored schedule is parked: no pass locks
-- it until a change or a resume clears its error.
SELECT s.*, COALESCE(CAST(:now AS timestamptz), now()) AS db_now
FROM schedules s
WHERE NOT s.paused AND s.errored_at IS NULL
  AND s.next_run_at <= COALESCE(CAST(:now AS timestamptz), now())
ORDER BY s.next_run_at
LIMIT :batch_size
FOR UPDATE SKIP LOCKED;

-- name: schedule_run_enqueue
-- Inserts the jobs of schedule runs in order (items: a job's fields, schedule_name and scheduled_for, its run_at); a run that has its job already is skipped and answered with no job.
-- The run's mark (schedule_name, scheduled_for) is written here and nowhere else, and
-- uq_jobs_schedule_run holds one job per mark: no idempotency key is set, so nothing a producer
-- enqueues can stand in for a run or keep one from being enqueued. (schedule_trigger writes
-- schedule_name alone, with scheduled_for NULL: no mark, and never a conflict with one.)
WITH items AS MATERIALIZED (
    SELECT t.ord, t.item,
           nextval((SELECT CAST(pg_get_serial_sequence('jobs', 'id') AS regclass))) AS new_id,
           (t.item->>'scheduled_for')::timestamptz AS run_at
    FROM jsonb_array_elements(CAST(:items AS jsonb)) WITH ORDINALITY AS t(item, ord)
),
inserted AS (
    INSERT INTO jobs (id, queue, type, payload, priority, status, max_attempts, lease_seconds,
                      timeout_seconds, run_at, concurrency_key, schedule_name, scheduled_for,
                      callback_url)
    OVERRIDING SYSTEM VALUE
    SELECT new_id,
           item->>'queue',
           item->>'type',
           COALESCE(item->'payload', 'null'::jsonb),
           (item->>'priority')::int,
           CASE WHEN run_at > now() THEN 'scheduled' ELSE 'pending' END,
           (item->>'max_attempts')::int,
           (item->>'lease_seconds')::int,
           (item->>'timeout_seconds')::int,
           run_at,
           item->>'concurrency_key',
           item->>'schedule_name',
           run_at,
           -- The queue's default callback (migration 0020), signed with JOBQ_WEBHOOK_SECRET.
           (SELECT q.callback_url FROM queues q WHERE q.name = item->>'queue')
    FROM items
    ORDER BY ord
    ON CONFLICT (schedule_name, scheduled_for) WHERE schedule_name IS NOT NULL DO NOTHING
    RETURNING *
)
SELECT items.ord AS ord, inserted.*
FROM items LEFT JOIN inserted ON inserted.id = items.new_id
ORDER BY items.ord;

-- name: schedule_run_jobs
-- Reads the jobs the scheduler enqueued for the given runs (keys: schedule_name, scheduled_for).
SELECT j.*
FROM jsonb_to_recordset(CAST(:keys AS jsonb)) AS k(schedule_name text, scheduled_for timestamptz)
JOIN jobs j ON j.schedule_name = k.schedule_name AND j.scheduled_for = k.scheduled_for;

-- name: schedule_trigger
-- Enqueues one pending job from a schedule's template now, outside its runs (next_run_at, last_run_at and last_job_id stay; a paused schedule too), where its queue matches :queue_patterns (NULL: any), recording schedule.trigger in audit_log; answers the schedule's queue with the job (NULL when out of scope), no row when there is no schedule.
-- The job carries schedule_name but no scheduled_for: uq_jobs_schedule_run treats the NULL as
-- distinct, so a trigger never takes or blocks a run's mark, and schedule_run_jobs (which looks
-- runs up by their instant) never mistakes it for a run. The template's unset max_attempts and
-- lease_seconds take :max_attempts and :lease_seconds, the defaults the runs' jobs get. The
-- schedule is read, not locked: the trigger changes nothing of it, and a lock would make the
-- scheduler's pass (FOR UPDATE SKIP LOCKED) skip the schedule.
WITH target AS (
    SELECT s.*,
           (CAST(:queue_patterns AS text[]) IS NULL
            OR s.queue LIKE ANY (CAST(:queue_patterns AS text[]))) AS in_scope
    FROM schedules s
    WHERE s.name = CAST(:name AS text)
),
inserted AS (
    INSERT INTO jobs (queue, type, payload, priority, status, max_attempts, lease_seconds,
                      timeout_seconds, run_at, concurrency_key, schedule_name, callback_url)
    SELECT t.queue, t.type, t.payload, t.priority, 'pending',
           COALESCE(t.max_attempts, CAST(:max_attempts AS int)),
           COALESCE(t.lease_seconds, CAST(:lease_seconds AS int)),
           t.timeout_seconds, now(), t.concurrency_key, t.name,
           (SELECT q.callback_url FROM queues q WHERE q.name = t.queue)
    FROM target t
    WHERE t.in_scope
    RETURNING *
),
audited AS (
    INSERT INTO audit_log (actor, actor_key_id, action, outcome, queue, job_id, state_before,
                           state_after, detail)
    SELECT CAST(:actor AS text), CAST(:actor_key_id AS bigint), 'schedule.trigger', 'changed',
           i.queue, i.id, NULL, i.status,
           jsonb_build_object('schedule', t.name, 'job_id', i.id, 'type', t.type,
                              'schedule_paused', t.paused, 'source', t.source)
    FROM target t CROSS JOIN inserted i
)
SELECT t.queue AS schedule_queue, i.*
FROM target t LEFT JOIN inserted i ON true;

-- name: schedule_park
-- Records why schedules could not be planned and parks them, only where next_run_at is still the value the pass read (items: name, expected, error); answers the names parked.
UPDATE schedules s
SET last_error = i.error,
    errored_at = now()
FROM jsonb_to_recordset(CAST(:items AS jsonb)) AS i(name text, expected timestamptz, error text)
WHERE s.name = i.name AND s.next_run_at = i.expected AND s.errored_at IS NULL
RETURNING s.name;

-- name: schedule_errored_counts
-- Schedules in error, per queue of their template.
SELECT queue, count(*)::int AS errored
FROM schedules
WHERE errored_at IS NOT NULL
GROUP BY queue
ORDER BY queue;

-- name: schedule_advance
-- Moves each schedule to its next run and records its latest run, only where next_run_at is still the value the pass read (items: name, expected, next_run_at, last_run_at, last_job_id); answers the names moved.
UPDATE schedules s
SET next_run_at = i.next_run_at,
    last_run_at = COALESCE(i.last_run_at, s.last_run_at),
    last_job_id = COALESCE(i.last_job_id, s.last_job_id)
FROM jsonb_to_recordset(CAST(:items AS jsonb))
         AS i(name text, expected timestamptz, next_run_at timestamptz, last_run_at timestamptz,
              last_job_id bigint)
WHERE s.name = i.name AND s.next_run_at = i.expected
RETURNING s.name;

-- name: schedule_lock
-- Locks one schedule for a change and answers it (all columns NULL when there is none) with the transaction's clock (db_now).
SELECT now() AS db_now, s.*
FROM (SELECT 1) AS one
LEFT JOIN LATERAL (SELECT * FROM schedules WHERE name = :name FOR UPDATE) s ON true;

-- name: schedule_upsert
-- Creates a schedule, or replaces a definition that differs or is in error (clearing the error); answers the row (with created) when it was written, nothing when the definition was the same.
-- A replacement keeps next_run_at while the timing (cron, interval, zone) stays and the schedule
-- is not being resumed, so re-applying a definition never moves or skips a run; otherwise it takes
-- :next_run_at, the first run after now. :paused NULL keeps the schedule's state (active if new).
INSERT INTO schedules AS s (name, cron, interval_seconds, timezone, queue, type, payload, priority,
                            max_attempts, lease_seconds, timeout_seconds, concurrency_key, catch_up,
                            paused, next_run_at, source)
VALUES (CAST(:name AS text), CAST(:cron AS text), CAST(:interval_seconds AS int),
        CAST(:timezone AS text), CAST(:queue AS text), CAST(:type AS text),
        CAST(:payload AS jsonb), CAST(:priority AS int), CAST(:max_attempts AS int),
        CAST(:lease_seconds AS int), CAST(:timeout_seconds AS int),
        CAST(:concurrency_key AS text), CAST(:catch_up AS int),
        COALESCE(CAST(:paused AS boolean), false), CAST(:next_run_at AS timestamptz),
        CAST(:source AS text))
ON CONFLICT (name) DO UPDATE
SET cron = EXCLUDED.cron,
    interval_seconds = EXCLUDED.interval_seconds,
    timezone = EXCLUDED.timezone,
    queue = EXCLUDED.queue,
    type = EXCLUDED.type,
    payload = EXCLUDED.payload,
    priority = EXCLUDED.priority,
    max_attempts = EXCLUDED.max_attempts,
    lease_seconds = EXCLUDED.lease_seconds,
    timeout_seconds = EXCLUDED.timeout_seconds,
    concurrency_key = EXCLUDED.concurrency_key,
    catch_up = EXCLUDED.catch_up,
    paused = COALESCE(CAST(:paused AS boolean), s.paused),
    next_run_at = CASE
        WHEN (s.cron, s.interval_seconds, s.timezone)
                 IS NOT DISTINCT FROM (EXCLUDED.cron, EXCLUDED.interval_seconds, EXCLUDED.timezone)
             AND NOT (s.paused AND NOT COALESCE(CAST(:paused AS boolean), s.paused))
        THEN s.next_run_at
        ELSE EXCLUDED.next_run_at
    END,
    source = EXCLUDED.source,
    last_error = NULL,
    errored_at = NULL,
    updated_at = now()
WHERE s.errored_at IS NOT NULL
   OR (s.cron, s.interval_seconds, s.timezone, s.queue, s.type, s.payload, s.priority,
       s.max_attempts, s.lease_seconds, s.timeout_seconds, s.concurrency_key, s.catch_up,
       s.source, s.paused)
      IS DISTINCT FROM
      (EXCLUDED.cron, EXCLUDED.interval_seconds, EXCLUDED.timezone, EXCLUDED.queue, EXCLUDED.type,
       EXCLUDED.payload, EXCLUDED.priority, EXCLUDED.max_attempts, EXCLUDED.lease_seconds,
       EXCLUDED.timeout_seconds, EXCLUDED.concurrency_key, EXCLUDED.catch_up, EXCLUDED.source,
       COALESCE(CAST(:paused AS boolean), s.paused))
RETURNING s.*, (s.xmax = 0) AS created;

-- name: schedule_set_paused
-- Pauses or resumes a schedule not already in that state, or resumes one in error (a resume moves it to :next_run_at, its first run after now, and clears the error); answers the row when it changed.
UPDATE schedules
SET paused = CAST(:paused AS boolean),
    next_run_at = COALESCE(CAST(:next_run_at AS timestamptz), next_run_at),
    last_error = CASE WHEN CAST(:paused AS boolean) THEN last_error END,
    errored_at = CASE WHEN CAST(:paused AS boolean) THEN errored_at END,
    updated_at = now()
WHERE name = :name
  AND (paused <> CAST(:paused AS boolean)
       OR (NOT CAST(:paused AS boolean) AND errored_at IS NOT NULL))
RETURNING *;

-- name: schedule_delete
-- Deletes one schedule (its jobs stay); answers it.
DELETE FROM schedules WHERE name = :name RETURNING *;

-- name: schedule_delete_stale_file
-- Deletes the schedules the JOBQ_SCHEDULES file made that it no longer names, in name order; answers them.
DELETE FROM schedules s
USING (SELECT name FROM schedules
       WHERE source = 'file' AND NOT (name = ANY (CAST(:names AS text[])))
       ORDER BY name
       FOR UPDATE) stale
WHERE s.name = stale.name
RETURNING s.*;

-- name: schedule_get
-- Reads one schedule by name.
SELECT * FROM schedules WHERE name = :name;

-- name: schedule_list
-- A page of schedules in name order after :after (NULL: from the first); with :queue_patterns (LIKE patterns), only those whose template queue matches.
SELECT *
FROM schedules
WHERE (CAST(:after AS text) IS NULL OR name > CAST(:after AS text))
  AND (CAST(:queue_patterns AS text[]) IS NULL
       OR queue LIKE ANY (CAST(:queue_patterns AS text[])))
ORDER BY name
LIMIT :limit;
