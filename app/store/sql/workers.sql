-- Named statements for the workers registry (migration 0017); app/store/workers.py (WorkerStore)
-- is the only caller. Each instance keeps the workers it saw claiming in memory and writes them
-- here every few seconds in one statement (worker_seen), so a claim itself writes nothing.
-- A worker is its id within its API key (key_id 0: no key).

-- name: worker_seen
-- Records sightings (worker id, key id, queues, instance) at now(), in key order so that two instances' writes never deadlock.
INSERT INTO workers (worker_id, key_id, queues, instance)
SELECT s.worker_id, s.key_id, s.queues, s.instance
FROM jsonb_to_recordset(CAST(:sightings AS jsonb))
     AS s(worker_id text, key_id bigint, queues text[], instance text)
ORDER BY s.worker_id, s.key_id
ON CONFLICT (worker_id, key_id) DO UPDATE
SET queues = EXCLUDED.queues, instance = EXCLUDED.instance, last_seen_at = now();

-- name: worker_prune
-- Deletes at most :batch_size workers not seen for :idle_seconds; answers how many.
WITH gone AS (
    SELECT worker_id, key_id FROM workers
    WHERE last_seen_at < now() - make_interval(secs => CAST(:idle_seconds AS float8))
    ORDER BY last_seen_at
    LIMIT :batch_size
)
DELETE FROM workers w USING gone
WHERE w.worker_id = gone.worker_id AND w.key_id = gone.key_id
RETURNING w.worker_id;

-- name: worker_overview
-- Workers seen claiming in the last :shown_seconds and workers holding leases, one row each: its key, the queues it polls, when first and last seen (a claim, or a heartbeat on a job it holds), whether live (seen in the last :live_seconds), and the jobs it holds with their types and start times; with :queue_patterns (LIKE), only matching queues and their jobs.
WITH held AS (
    -- Walks ix_jobs_running_lease_expires_at: its size is the running jobs, not the history.
    SELECT j.worker_id, COALESCE(j.lease_key_id, 0) AS key_id,
           count(*) AS jobs_held,
           array_agg(j.id ORDER BY j.id) AS job_ids,
           array_agg(j.type ORDER BY j.id) AS job_types,
           array_agg(j.started_at ORDER BY j.id) AS job_started,
           array_agg(j.lease_expires_at ORDER BY j.id) AS lease_expiries,
           string_agg(DISTINCT j.lease_instance, ', ') AS instance,
           min(j.lease_expires_at) AS next_lease_expiry,
           max(j.updated_at) AS touched_at
    FROM jobs j
    WHERE j.status = 'running' AND j.lease_expires_at IS NOT NULL
      AND (CAST(:queue_patterns AS text[]) IS NULL
           OR j.queue LIKE ANY (CAST(:queue_patterns AS text[])))
    GROUP BY j.worker_id, COALESCE(j.lease_key_id, 0)
),
seen AS (
    SELECT w.worker_id, w.key_id, w.instance, w.first_seen_at, w.last_seen_at,
           ARRAY(SELECT q FROM unnest(w.queues) AS q
                 WHERE CAST(:queue_patterns AS text[]) IS NULL
                    OR q LIKE ANY (CAST(:queue_patterns AS text[]))
                 ORDER BY q) AS queues
    FROM workers w
    WHERE w.last_seen_at > now() - make_interval(secs => CAST(:shown_seconds AS float8))
),
merged AS (
    SELECT COALESCE(s.worker_id, h.worker_id) AS worker_id,
           COALESCE(s.key_id, h.key_id) AS key_id,
           COALESCE(s.queues, ARRAY[]::text[]) AS queues,
           COALESCE(h.instance, s.instance) AS instance,
           s.first_seen_at,
           GREATEST(s.last_seen_at, h.touched_at) AS last_seen_at,
           COALESCE(h.jobs_held, 0)::bigint AS jobs_held,
           COALESCE(h.job_ids, ARRAY[]::bigint[]) AS job_ids,
           COALESCE(h.job_types, ARRAY[]::text[]) AS job_types,
           COALESCE(h.job_started, ARRAY[]::timestamptz[]) AS job_started,
           COALESCE(h.lease_expiries, ARRAY[]::timestamptz[]) AS lease_expiries,
           h.next_lease_expiry
    FROM seen s
    FULL JOIN held h ON h.worker_id = s.worker_id AND h.key_id = s.key_id
)
SELECT m.worker_id, k.name AS key_name, m.queues, m.instance, m.first_seen_at, m.last_seen_at,
       m.last_seen_at > now() - make_interval(secs => CAST(:live_seconds AS float8)) AS live,
       m.jobs_held, m.job_ids, m.job_types, m.job_started, m.lease_expiries, m.next_lease_expiry
FROM merged m
LEFT JOIN api_keys k ON k.id = NULLIF(m.key_id, 0)
-- A scoped view shows a worker only for what it does in the key's queues.
WHERE CAST(:queue_patterns AS text[]) IS NULL OR m.jobs_held > 0 OR cardinality(m.queues) > 0
ORDER BY m.jobs_held = 0, m.worker_id, m.key_id;

-- name: worker_live_per_queue
-- Per queue named, how many workers seen in the last :live_seconds poll it.
SELECT q.name AS queue, count(w.worker_id)::bigint AS live_workers
FROM unnest(CAST(:queues AS text[])) AS q(name)
LEFT JOIN workers w
       ON q.name = ANY (w.queues)
      AND w.last_seen_at > now() - make_interval(secs => CAST(:live_seconds AS float8))
GROUP BY q.name;
