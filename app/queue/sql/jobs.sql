-- Named statements for the jobs table. Each block starts with "-- name: <name>" and one line
-- saying what it does; app/queue/queries.py loads them and app/queue/repository.py is the only
-- caller. Parameters are :name binds; jsonb arguments are passed as JSON text.
-- Every state change is one conditional statement: the rows it returns are the verdict.

-- name: job_enqueue
-- Inserts jobs in order; an item whose (queue, idempotency_key) exists is skipped and answered with no job.
WITH items AS MATERIALIZED (
    SELECT t.ord, t.item, nextval(pg_get_serial_sequence('jobs', 'id')) AS new_id
    FROM jsonb_array_elements(CAST(:items AS jsonb)) WITH ORDINALITY AS t(item, ord)
),
inserted AS (
    INSERT INTO jobs (id, queue, type, payload, priority, max_attempts, lease_seconds,
                      timeout_seconds, run_at, idempotency_key, idempotency_hash)
    OVERRIDING SYSTEM VALUE
    SELECT new_id,
           item->>'queue',
           item->>'type',
           COALESCE(item->'payload', 'null'::jsonb),
           (item->>'priority')::int,
           (item->>'max_attempts')::int,
           (item->>'lease_seconds')::int,
           (item->>'timeout_seconds')::int,
           COALESCE((item->>'run_at')::timestamptz,
                    now() + make_interval(secs => COALESCE((item->>'delay_seconds')::float8, 0))),
           item->>'idempotency_key',
           item->>'idempotency_hash'
    FROM items
    ORDER BY ord
    ON CONFLICT (queue, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING *
)
SELECT items.ord AS ord, inserted.*, now() AS db_now
FROM items LEFT JOIN inserted ON inserted.id = items.new_id
ORDER BY items.ord;

-- name: job_get_by_idempotency_keys
-- Reads the jobs holding the given (queue, idempotency_key) pairs.
SELECT j.*, now() AS db_now
FROM jsonb_to_recordset(CAST(:keys AS jsonb)) AS k(queue text, idempotency_key text)
JOIN jobs j ON j.queue = k.queue AND j.idempotency_key = k.idempotency_key;

-- name: job_get
-- Reads one job by id.
SELECT j.*, now() AS db_now FROM jobs j WHERE j.id = :id;

-- name: job_claim
-- Leases up to :max_jobs due jobs from the given unpaused queues, best priority first, skipping rows others hold.
-- Each queue is walked in ix_jobs_claimable order (no sort of the backlog); only the few candidates are sorted.
WITH queue_names AS (
    SELECT DISTINCT q.name
    FROM unnest(CAST(:queues AS text[])) AS q(name)
    WHERE NOT EXISTS (SELECT 1 FROM queues p WHERE p.name = q.name AND p.paused)
),
candidates AS (
    SELECT c.id, c.priority, c.run_at
    FROM queue_names qn
    CROSS JOIN LATERAL (
        SELECT j.id, j.priority, j.run_at
        FROM jobs j
        WHERE j.queue = qn.name AND j.status = 'pending' AND j.run_at <= now()
        ORDER BY j.priority DESC, j.run_at, j.id
        LIMIT :max_jobs
        FOR UPDATE SKIP LOCKED
    ) c
),
picked AS MATERIALIZED (
    SELECT id FROM candidates ORDER BY priority DESC, run_at, id LIMIT :max_jobs
)
UPDATE jobs j
SET status = 'running',
    attempts = j.attempts + 1,
    lease_id = gen_random_uuid(),
    worker_id = :worker_id,
    lease_granted_seconds = COALESCE(CAST(:lease_seconds AS int), j.lease_seconds),
    lease_expires_at = now() + make_interval(secs => LEAST(
        COALESCE(CAST(:lease_seconds AS int), j.lease_seconds),
        COALESCE(j.timeout_seconds, 2147483647))),
    started_at = now(),
    updated_at = now()
FROM picked
WHERE j.id = picked.id
RETURNING j.*, now() AS db_now;

-- name: job_heartbeat
-- Extends the leases the worker still holds, saving checkpoint and progress in the same ownership-checked update.
WITH items AS MATERIALIZED (
    SELECT t.ord,
           (t.item->>'job_id')::bigint AS job_id,
           (t.item->>'lease_id')::uuid AS lease_id,
           (t.item->>'lease_seconds')::int AS lease_seconds,
           t.item ? 'checkpoint' AS has_checkpoint,
           NULLIF(t.item->'checkpoint', 'null'::jsonb) AS checkpoint,
           t.item ? 'progress' AS has_progress,
           NULLIF(t.item->'progress', 'null'::jsonb) AS progress
    FROM jsonb_array_elements(CAST(:items AS jsonb)) WITH ORDINALITY AS t(item, ord)
),
updated AS (
    UPDATE jobs j
    -- Never past the attempt's maximum run time: a stuck worker cannot heartbeat forever.
    SET lease_expires_at = LEAST(
            now() + make_interval(secs => COALESCE(i.lease_seconds, j.lease_granted_seconds,
                                                   j.lease_seconds)),
            j.started_at + make_interval(secs => j.timeout_seconds)),
        checkpoint = CASE WHEN i.has_checkpoint THEN i.checkpoint ELSE j.checkpoint END,
        checkpoint_at = CASE WHEN i.has_checkpoint THEN now() ELSE j.checkpoint_at END,
        progress = CASE WHEN i.has_progress THEN i.progress ELSE j.progress END,
        updated_at = now()
    FROM items i
    WHERE j.id = i.job_id AND j.lease_id = i.lease_id
      AND j.status = 'running' AND j.worker_id = :worker_id
      AND (j.timeout_seconds IS NULL
           OR now() < j.started_at + make_interval(secs => j.timeout_seconds))
    RETURNING j.id, j.lease_id, j.status, j.lease_expires_at
)
SELECT i.ord, i.job_id, u.status, u.lease_expires_at,
       COALESCE(cur.status = 'cancelled' AND cur.lease_id = i.lease_id, false) AS cancelled,
       COALESCE(u.id IS NULL AND cur.status = 'running' AND cur.lease_id = i.lease_id
                AND now() >= cur.started_at + make_interval(secs => cur.timeout_seconds),
                false) AS timed_out
FROM items i
LEFT JOIN updated u ON u.id = i.job_id AND u.lease_id = i.lease_id
LEFT JOIN jobs cur ON cur.id = i.job_id
ORDER BY i.ord;

-- name: job_complete
-- Marks held jobs succeeded with their result; a repeat with the same lease answers the same success.
WITH items AS MATERIALIZED (
    SELECT t.ord,
           (t.item->>'job_id')::bigint AS job_id,
           (t.item->>'lease_id')::uuid AS lease_id,
           NULLIF(t.item->'result', 'null'::jsonb) AS result
    FROM jsonb_array_elements(CAST(:items AS jsonb)) WITH ORDINALITY AS t(item, ord)
),
updated AS (
    UPDATE jobs j
    SET status = 'succeeded',
        result = i.result,
        finished_at = now(),
        lease_expires_at = NULL,
        updated_at = now()
    FROM items i
    WHERE j.id = i.job_id AND j.lease_id = i.lease_id
      AND j.status = 'running' AND j.worker_id = :worker_id
    RETURNING j.id, j.lease_id, j.status
)
SELECT i.ord, i.job_id,
       COALESCE(u.status,
                CASE WHEN cur.status = 'succeeded' AND cur.lease_id = i.lease_id
                          AND cur.worker_id = :worker_id THEN cur.status END) AS status,
       COALESCE(cur.status = 'cancelled' AND cur.lease_id = i.lease_id, false) AS cancelled
FROM items i
LEFT JOIN updated u ON u.id = i.job_id AND u.lease_id = i.lease_id
LEFT JOIN jobs cur ON cur.id = i.job_id
ORDER BY i.ord;

-- name: job_fail
-- Records a failed attempt of held jobs: back to pending after a backoff, or dead when not retryable or out of attempts.
WITH items AS MATERIALIZED (
    SELECT t.ord,
           (t.item->>'job_id')::bigint AS job_id,
           (t.item->>'lease_id')::uuid AS lease_id,
           left(COALESCE(t.item->>'error', ''), CAST(:error_max_chars AS int)) AS error,
           COALESCE((t.item->>'retryable')::boolean, true) AS retryable,
           (t.item->>'retry_after_seconds')::float8 AS retry_after_seconds,
           t.item ? 'checkpoint' AS has_checkpoint,
           NULLIF(t.item->'checkpoint', 'null'::jsonb) AS checkpoint
    FROM jsonb_array_elements(CAST(:items AS jsonb)) WITH ORDINALITY AS t(item, ord)
),
updated AS (
    UPDATE jobs j
    SET status = CASE WHEN i.retryable AND j.attempts < j.max_attempts
                      THEN 'pending' ELSE 'dead' END,
        run_at = CASE WHEN i.retryable AND j.attempts < j.max_attempts
                      THEN now() + COALESCE(make_interval(secs => i.retry_after_seconds),
                                            jobq_backoff(j.attempts, CAST(:backoff_base AS float8),
                                                         CAST(:backoff_cap AS float8)))
                      ELSE j.run_at END,
        finished_at = CASE WHEN i.retryable AND j.attempts < j.max_attempts
                           THEN NULL ELSE now() END,
        last_error = i.error,
        errors = jobq_errors_append(
            j.errors,
            jsonb_build_object('attempt', j.attempts, 'at', now(), 'error', i.error,
                               'worker_id', j.worker_id, 'kind', 'failed'),
            CAST(:errors_kept AS int)),
        checkpoint = CASE WHEN i.has_checkpoint THEN i.checkpoint ELSE j.checkpoint END,
        checkpoint_at = CASE WHEN i.has_checkpoint THEN now() ELSE j.checkpoint_at END,
        lease_expires_at = NULL,
        updated_at = now()
    FROM items i
    WHERE j.id = i.job_id AND j.lease_id = i.lease_id
      AND j.status = 'running' AND j.worker_id = :worker_id
    RETURNING j.id, j.lease_id, j.status, j.run_at
)
SELECT i.ord, i.job_id,
       COALESCE(u.status,
                CASE WHEN cur.status IN ('pending', 'dead') AND cur.lease_id = i.lease_id
                          AND cur.worker_id = :worker_id THEN cur.status END) AS status,
       COALESCE(u.run_at, cur.run_at) AS run_at,
       cur.queue,
       u.id IS NOT NULL AND u.status = 'pending' AND u.run_at <= now() AS claimable_now,
       COALESCE(cur.status = 'cancelled' AND cur.lease_id = i.lease_id, false) AS cancelled
FROM items i
LEFT JOIN updated u ON u.id = i.job_id AND u.lease_id = i.lease_id
LEFT JOIN jobs cur ON cur.id = i.job_id
ORDER BY i.ord;

-- name: job_release
-- Returns held jobs to pending (now or after a delay) without charging the attempt, keeping or replacing the checkpoint.
WITH items AS MATERIALIZED (
    SELECT t.ord,
           (t.item->>'job_id')::bigint AS job_id,
           (t.item->>'lease_id')::uuid AS lease_id,
           COALESCE((t.item->>'delay_seconds')::float8, 0) AS delay_seconds,
           t.item ? 'checkpoint' AS has_checkpoint,
           NULLIF(t.item->'checkpoint', 'null'::jsonb) AS checkpoint
    FROM jsonb_array_elements(CAST(:items AS jsonb)) WITH ORDINALITY AS t(item, ord)
),
updated AS (
    UPDATE jobs j
    SET status = 'pending',
        attempts = GREATEST(j.attempts - 1, 0),
        run_at = now() + make_interval(secs => i.delay_seconds),
        checkpoint = CASE WHEN i.has_checkpoint THEN i.checkpoint ELSE j.checkpoint END,
        checkpoint_at = CASE WHEN i.has_checkpoint THEN now() ELSE j.checkpoint_at END,
        lease_expires_at = NULL,
        updated_at = now()
    FROM items i
    WHERE j.id = i.job_id AND j.lease_id = i.lease_id
      AND j.status = 'running' AND j.worker_id = :worker_id
    RETURNING j.id, j.lease_id, j.status, j.run_at
)
SELECT i.ord, i.job_id,
       COALESCE(u.status,
                CASE WHEN cur.status = 'pending' AND cur.lease_id = i.lease_id
                          AND cur.worker_id = :worker_id THEN cur.status END) AS status,
       COALESCE(u.run_at, cur.run_at) AS run_at,
       cur.queue,
       u.id IS NOT NULL AND u.status = 'pending' AND u.run_at <= now() AS claimable_now,
       COALESCE(cur.status = 'cancelled' AND cur.lease_id = i.lease_id, false) AS cancelled
FROM items i
LEFT JOIN updated u ON u.id = i.job_id AND u.lease_id = i.lease_id
LEFT JOIN jobs cur ON cur.id = i.job_id
ORDER BY i.ord;

-- name: job_cancel
-- Cancels a pending or running job; a running job's lease stops being honoured at once.
UPDATE jobs
SET status = 'cancelled', finished_at = now(), lease_expires_at = NULL, updated_at = now()
WHERE id = :id AND status IN ('pending', 'running')
RETURNING *, now() AS db_now;

-- name: job_retry
-- Puts a dead, cancelled or succeeded job back to pending with its attempts reset (its checkpoint is kept).
UPDATE jobs
SET status = 'pending', attempts = 0, run_at = now(), lease_id = NULL, worker_id = NULL,
    lease_expires_at = NULL, started_at = NULL, finished_at = NULL, result = NULL,
    updated_at = now()
WHERE id = :id AND status IN ('dead', 'cancelled', 'succeeded')
RETURNING *, now() AS db_now;

-- name: job_reap
-- Moves at most :batch_size running jobs whose lease expired (or whose run time passed timeout_seconds) back to pending after a backoff, or to dead on the last attempt.
WITH expired AS MATERIALIZED (
    SELECT id,
           timeout_seconds IS NOT NULL
               AND now() >= started_at + make_interval(secs => timeout_seconds) AS timed_out
    FROM jobs
    WHERE status = 'running' AND lease_expires_at < now()
    ORDER BY lease_expires_at
    LIMIT :batch_size
    FOR UPDATE SKIP LOCKED
),
reasons AS (
    SELECT id, timed_out,
           CASE WHEN timed_out THEN 'timed out' ELSE 'lease expired' END AS reason
    FROM expired
)
UPDATE jobs j
SET status = CASE WHEN j.attempts < j.max_attempts THEN 'pending' ELSE 'dead' END,
    run_at = CASE WHEN j.attempts < j.max_attempts
                  THEN now() + jobq_backoff(j.attempts, CAST(:backoff_base AS float8),
                                            CAST(:backoff_cap AS float8))
                  ELSE j.run_at END,
    finished_at = CASE WHEN j.attempts < j.max_attempts THEN NULL ELSE now() END,
    last_error = r.reason,
    errors = jobq_errors_append(
        j.errors,
        jsonb_build_object('attempt', j.attempts, 'at', now(), 'error', r.reason,
                           'worker_id', j.worker_id,
                           'kind', CASE WHEN r.timed_out THEN 'timed_out' ELSE 'lease_expired' END),
        CAST(:errors_kept AS int)),
    -- The lease is void: clearing it keeps a late fail / release from passing as a replay.
    lease_id = NULL,
    lease_expires_at = NULL,
    updated_at = now()
FROM reasons r
WHERE j.id = r.id AND j.status = 'running' AND j.lease_expires_at < now()
RETURNING j.id, j.queue, j.status;

-- name: queue_set_paused
-- Pauses or resumes a queue; claims skip paused queues.
INSERT INTO queues (name, paused) VALUES (:name, :paused)
ON CONFLICT (name) DO UPDATE SET paused = EXCLUDED.paused, updated_at = now()
RETURNING name, paused, updated_at;

-- name: queue_stats
-- Counts jobs per queue and state, with the age of the oldest due pending job, for every known queue.
WITH names AS (
    SELECT DISTINCT queue AS name FROM jobs
    UNION
    SELECT name FROM queues
),
counts AS (
    SELECT queue,
           count(*) FILTER (WHERE status = 'pending' AND run_at > now()) AS scheduled,
           count(*) FILTER (WHERE status = 'pending' AND run_at <= now()) AS pending,
           count(*) FILTER (WHERE status = 'running') AS running,
           count(*) FILTER (WHERE status = 'succeeded') AS succeeded,
           count(*) FILTER (WHERE status = 'dead') AS dead,
           count(*) FILTER (WHERE status = 'cancelled') AS cancelled,
           min(run_at) FILTER (WHERE status = 'pending' AND run_at <= now()) AS oldest_due_at,
           count(*) FILTER (WHERE status = 'succeeded' AND finished_at > now() - interval '1 minute')
               AS succeeded_last_minute
    FROM jobs
    GROUP BY queue
)
SELECT n.name,
       COALESCE(q.paused, false) AS paused,
       COALESCE(c.scheduled, 0) AS scheduled,
       COALESCE(c.pending, 0) AS pending,
       COALESCE(c.running, 0) AS running,
       COALESCE(c.succeeded, 0) AS succeeded,
       COALESCE(c.dead, 0) AS dead,
       COALESCE(c.cancelled, 0) AS cancelled,
       EXTRACT(EPOCH FROM now() - c.oldest_due_at)::float8 AS oldest_pending_age_seconds,
       COALESCE(c.succeeded_last_minute, 0) AS succeeded_last_minute
FROM names n
LEFT JOIN queues q ON q.name = n.name
LEFT JOIN counts c ON c.queue = n.name
ORDER BY n.name;

-- name: worker_list
-- Lists the workers holding leases now, with the jobs they hold.
SELECT worker_id,
       count(*) AS jobs_held,
       array_agg(id ORDER BY id) AS job_ids,
       min(lease_expires_at) AS next_lease_expiry,
       max(updated_at) AS last_seen_at
FROM jobs
WHERE status = 'running'
GROUP BY worker_id
ORDER BY worker_id;

-- name: maintenance_try_lead
-- Tries to take the session-level advisory lock that elects the maintenance leader.
SELECT pg_try_advisory_lock(:lock_key) AS acquired;

-- name: maintenance_ping
-- Confirms the leader's lock connection is still alive.
SELECT 1 AS alive;

-- name: health_ping
-- Confirms the database answers.
SELECT 1 AS alive;

-- name: job_prune
-- Deletes at most :batch_size finished jobs whose retention has passed (succeeded, cancelled, dead each have their own).
WITH doomed AS MATERIALIZED (
    SELECT id
    FROM jobs
    WHERE status IN ('succeeded', 'cancelled', 'dead')
      AND finished_at < now() - make_interval(secs => CASE status
              WHEN 'succeeded' THEN CAST(:succeeded_seconds AS float8)
              WHEN 'cancelled' THEN CAST(:cancelled_seconds AS float8)
              ELSE CAST(:dead_seconds AS float8) END)
    ORDER BY finished_at
    LIMIT :batch_size
    FOR UPDATE SKIP LOCKED
)
DELETE FROM jobs j
USING doomed
WHERE j.id = doomed.id AND j.status IN ('succeeded', 'cancelled', 'dead')
RETURNING j.id;
