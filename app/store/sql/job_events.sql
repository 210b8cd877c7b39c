-- Named statements for job_events, a job's history (migration 0017); app/store/job_events.py
-- (JobEventStore) is the only caller. The rows are written by the transitions themselves, in the
-- same statement (sql/jobs.sql); these read them. The happy path writes no rows: a job's
-- enqueue, the claim of its current (or last) attempt and its completion are read from its own
-- columns and merged in, unless a row records them already (an operator's retry writes them
-- down before it clears the columns).

-- name: job_event_list
-- A page of one job's history, oldest first, after the keyset position (:after_at, :after_id); derived events have id 0.
WITH job AS (
    SELECT * FROM jobs WHERE id = :job_id
),
events AS (
    SELECT e.id, e.at, e.kind, e.attempt, e.actor, e.actor_key_id, e.instance, e.data
    FROM job_events e
    WHERE e.job_id = :job_id
    UNION ALL
    SELECT 0, j.created_at, 'enqueued', NULL, NULL, NULL, NULL,
           jsonb_strip_nulls(jsonb_build_object('queue', j.queue, 'schedule', j.schedule_name,
                                                'scheduled_for', j.scheduled_for))
    FROM job j
    UNION ALL
    SELECT 0, j.started_at, 'claimed', j.attempts, j.worker_id, j.lease_key_id,
           j.lease_instance, NULL
    FROM job j
    WHERE j.started_at IS NOT NULL
      AND NOT EXISTS (SELECT 1 FROM job_events s
                      WHERE s.job_id = j.id AND s.kind = 'claimed' AND s.at = j.started_at)
    UNION ALL
    SELECT 0, j.finished_at, 'completed', j.attempts, j.worker_id, j.lease_key_id,
           j.lease_instance,
           jsonb_build_object('ran_seconds', EXTRACT(EPOCH FROM j.finished_at - j.started_at))
    FROM job j
    WHERE j.status = 'succeeded' AND j.finished_at IS NOT NULL
      AND NOT EXISTS (SELECT 1 FROM job_events s
                      WHERE s.job_id = j.id AND s.kind = 'completed' AND s.at = j.finished_at)
)
SELECT ev.*, k.name AS key_name
FROM events ev
LEFT JOIN api_keys k ON k.id = ev.actor_key_id
WHERE CAST(:after_at AS timestamptz) IS NULL
   OR (ev.at, ev.id) > (CAST(:after_at AS timestamptz), CAST(:after_id AS bigint))
ORDER BY ev.at, ev.id
LIMIT :limit;

-- name: job_failure_groups
-- Groups the newest failures (at most :scan of them) since :since by queue, job type, error type and the message with its numbers, ids and quoted values masked; with :queue_patterns (LIKE), only matching queues.
WITH recent AS MATERIALIZED (
    SELECT e.id, e.job_id, e.at, e.kind, e.data
    FROM job_events e
    WHERE e.kind IN ('failed', 'lease_expired', 'timed_out')
      AND e.at >= CAST(:since AS timestamptz)
    ORDER BY e.at DESC
    LIMIT :scan
),
failures AS (
    SELECT r.job_id, r.at, j.queue, j.type, j.status,
           COALESCE(r.data->>'type', r.kind) AS error_type,
           COALESCE(r.data->>'error', '') AS message
    FROM recent r
    JOIN jobs j ON j.id = r.job_id
    WHERE (CAST(:queue_patterns AS text[]) IS NULL
           OR j.queue LIKE ANY (CAST(:queue_patterns AS text[])))
      AND (CAST(:queue AS text) IS NULL OR j.queue = CAST(:queue AS text))
),
masked AS (
    SELECT f.*, jobq_mask_message(f.message) AS pattern
    FROM failures f
)
SELECT m.queue, m.type, m.error_type, m.pattern,
       count(*) AS failures,
       count(*) FILTER (WHERE m.at >= now() - interval '1 hour') AS failures_last_hour,
       count(DISTINCT m.job_id) AS jobs,
       count(DISTINCT m.job_id) FILTER (WHERE m.status = 'dead') AS dead_jobs,
       min(m.at) AS first_seen_at,
       max(m.at) AS last_seen_at,
       (array_agg(m.message ORDER BY m.at DESC))[1] AS last_message,
       (array_agg(DISTINCT m.job_id ORDER BY m.job_id DESC))[1:CAST(:samples AS int)] AS sample_job_ids,
       (SELECT count(*) FROM recent) AS scanned
FROM masked m
GROUP BY m.queue, m.type, m.error_type, m.pattern
ORDER BY count(*) DESC, max(m.at) DESC
LIMIT :limit;

-- name: job_failure_group_ids
-- The jobs of one failure group (as job_failure_groups names it) now in one of :statuses, newest first, at most :limit: what "retry this group" and "cancel this group" act on.
WITH recent AS MATERIALIZED (
    SELECT e.job_id, e.kind, e.data
    FROM job_events e
    WHERE e.kind IN ('failed', 'lease_expired', 'timed_out')
      AND e.at >= CAST(:since AS timestamptz)
    ORDER BY e.at DESC
    LIMIT :scan
)
SELECT DISTINCT j.id
FROM recent r
JOIN jobs j ON j.id = r.job_id
WHERE j.queue = CAST(:queue AS text) AND j.type = CAST(:type AS text)
  AND COALESCE(r.data->>'type', r.kind) = CAST(:error_type AS text)
  AND jobq_mask_message(COALESCE(r.data->>'error', '')) = CAST(:pattern AS text)
  AND j.status = ANY (CAST(:statuses AS text[]))
  AND (CAST(:queue_patterns AS text[]) IS NULL
       OR j.queue LIKE ANY (CAST(:queue_patterns AS text[])))
ORDER BY j.id DESC
LIMIT :limit;
