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
-- Groups the newest failures (at most :scan of them) since :since by queue, job type, error type and cause: the fingerprint of the traceback's frames the failure was recorded with, else the message with every token holding a digit or a quoted value masked; with :queue_patterns (LIKE), only matching queues.
-- A group's key is (queue, type, error_type, fingerprint): the traceback's fingerprint, or "m:"
-- and the md5 of the masked message. Only failures without a fingerprint are masked (old ones,
-- those sent without a traceback, expired and timed-out leases); a traceback group shows the
-- masked message of its newest failure, and every group the traceback of its newest failure
-- (read for the groups answered only), from which the service says where it was raised.
WITH recent AS MATERIALIZED (
    SELECT e.id, e.job_id, e.at, e.kind, e.data
    FROM job_events e
    WHERE e.kind IN ('failed', 'lease_expired', 'timed_out')
      AND e.at >= CAST(:since AS timestamptz)
    ORDER BY e.at DESC
    LIMIT :scan
),
failures AS (
    SELECT r.id AS event_id, r.job_id, r.at, j.queue, j.type, j.status,
           COALESCE(r.data->>'type', r.kind) AS error_type,
           COALESCE(r.data->>'error', '') AS message,
           r.data->>'fingerprint' AS frames
    FROM recent r
    JOIN jobs j ON j.id = r.job_id
    WHERE (CAST(:queue_patterns AS text[]) IS NULL
           OR j.queue LIKE ANY (CAST(:queue_patterns AS text[])))
      AND (CAST(:queue AS text) IS NULL OR j.queue = CAST(:queue AS text))
),
keyed AS (
    SELECT f.*, CASE WHEN f.frames IS NULL THEN jobq_failure_pattern(f.message) END AS pattern
    FROM failures f
),
groups AS (
    SELECT k.queue, k.type, k.error_type, k.frames, k.pattern,
           count(*) AS failures,
           count(*) FILTER (WHERE k.at >= now() - interval '1 hour') AS failures_last_hour,
           count(DISTINCT k.job_id) AS jobs,
           count(DISTINCT k.job_id) FILTER (WHERE k.status = 'dead') AS dead_jobs,
           min(k.at) AS first_seen_at,
           max(k.at) AS last_seen_at,
           (array_agg(k.message ORDER BY k.at DESC, k.event_id DESC))[1] AS last_message,
           (array_agg(k.event_id ORDER BY k.at DESC, k.event_id DESC))[1] AS last_event_id,
           (array_agg(DISTINCT k.job_id ORDER BY k.job_id DESC))[1:CAST(:samples AS int)]
               AS sample_job_ids
    FROM keyed k
    GROUP BY k.queue, k.type, k.error_type, k.frames, k.pattern
    ORDER BY count(*) DESC, max(k.at) DESC
    LIMIT :limit
)
SELECT g.queue, g.type, g.error_type,
       COALESCE(g.frames, 'm:' || md5(g.pattern)) AS fingerprint,
       COALESCE(g.pattern, jobq_failure_pattern(g.last_message)) AS pattern,
       g.failures, g.failures_last_hour, g.jobs, g.dead_jobs, g.first_seen_at, g.last_seen_at,
       g.last_message, g.sample_job_ids,
       (SELECT count(*) FROM recent) AS scanned,
       g.frames IS NOT NULL AS by_traceback,
       e.data->>'traceback' AS last_traceback
FROM groups g
LEFT JOIN job_events e ON e.id = g.last_event_id
ORDER BY g.failures DESC, g.last_seen_at DESC;

-- name: job_failure_group_ids
-- The jobs of one failure group (as job_failure_groups keys it: queue, type, error type and fingerprint) now in one of :statuses, newest first, at most :limit: what "retry this group" and "cancel this group" act on.
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
  AND COALESCE(r.data->>'fingerprint',
               'm:' || md5(jobq_failure_pattern(COALESCE(r.data->>'error', ''))))
      = CAST(:fingerprint AS text)
  AND j.status = ANY (CAST(:statuses AS text[]))
  AND (CAST(:queue_patterns AS text[]) IS NULL
       OR j.queue LIKE ANY (CAST(:queue_patterns AS text[])))
ORDER BY j.id DESC
LIMIT :limit;
