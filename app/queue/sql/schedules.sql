-- Named statements for periodic jobs (the schedules table, migration 0013). Each block starts with
-- "-- name: <name>" and one line saying what it does; app/queue/repository.py is the only caller.
-- When a schedule runs is computed in Python (app/queue/schedules.py: cron and time zones), from
-- the database's clock read in the same transaction; what is due and what moves is decided here.
-- The scheduler's statements take an optional :now (NULL: the database's now()), so tests can run
-- a pass exactly at a due time.

-- name: schedule_due
-- Locks at most :batch_size active schedules whose next run is due by :now, earliest first, skipping rows another pass holds; answers them with the clock they were judged by (db_now).
-- Walks ix_schedules_due (active schedules by next_run_at): its size is the schedules, and a pass
-- reads only the due ones.
SELECT s.*, COALESCE(CAST(:now AS timestamptz), now()) AS db_now
FROM schedules s
WHERE NOT s.paused AND s.next_run_at <= COALESCE(CAST(:now AS timestamptz), now())
ORDER BY s.next_run_at
LIMIT :batch_size
FOR UPDATE SKIP LOCKED;

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
-- Creates a schedule, or replaces a definition that differs; answers the row (with created) when it was written, nothing when the definition was the same.
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
    updated_at = now()
WHERE (s.cron, s.interval_seconds, s.timezone, s.queue, s.type, s.payload, s.priority,
       s.max_attempts, s.lease_seconds, s.timeout_seconds, s.concurrency_key, s.catch_up,
       s.source, s.paused)
      IS DISTINCT FROM
      (EXCLUDED.cron, EXCLUDED.interval_seconds, EXCLUDED.timezone, EXCLUDED.queue, EXCLUDED.type,
       EXCLUDED.payload, EXCLUDED.priority, EXCLUDED.max_attempts, EXCLUDED.lease_seconds,
       EXCLUDED.timeout_seconds, EXCLUDED.concurrency_key, EXCLUDED.catch_up, EXCLUDED.source,
       COALESCE(CAST(:paused AS boolean), s.paused))
RETURNING s.*, (s.xmax = 0) AS created;

-- name: schedule_set_paused
-- Pauses or resumes a schedule not already in that state (a resume moves it to :next_run_at, its first run after now); answers the row when it changed.
UPDATE schedules
SET paused = CAST(:paused AS boolean),
    next_run_at = COALESCE(CAST(:next_run_at AS timestamptz), next_run_at),
    updated_at = now()
WHERE name = :name AND paused <> CAST(:paused AS boolean)
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
