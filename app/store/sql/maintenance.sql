-- Named statements of the maintenance loops that move jobs in bounded batches (the reaper, the
-- promoter, the pruner; app/maintenance/ holds the loops, app/queue/upkeep.py the service), and
-- of maintenance_set_aside (migration 0025): the jobs such a loop could not move even alone.
-- app/store/maintenance.py (MaintenanceStore) is the only caller. Statements take an optional
-- :now (NULL: the database's now()), so tests can run them exactly at a deadline.


-- The maintenance statements below come in threes: the batch (e.g. job_reap), the same work on
-- one job by id (job_reap_one) and the batch's candidates (job_reap_candidates). A batch that
-- fails in a way a retry would repeat is done again one job at a time, and a job that fails
-- alone is recorded in maintenance_set_aside, which every batch then leaves out
-- (app/queue/upkeep.py): one poisoned job never stops the loop for the others.

-- fragment: job_reap_set_aside
-- Not set aside by the reaper (an anti-join on the primary key of a table that is mostly empty).
AND NOT EXISTS (SELECT 1 FROM maintenance_set_aside s WHERE s.loop = 'reaper' AND s.job_id = j.id)

-- fragment: job_reap_move
-- What the reaper does to the expired leases it locked (CTE expired, with clock).
reasons AS (
    SELECT id, timed_out,
           CASE WHEN timed_out THEN 'timed out' ELSE 'lease expired' END AS reason
    FROM expired
),
reaped AS (
    UPDATE jobs j
    SET status = CASE WHEN j.attempts < j.max_attempts THEN 'scheduled' ELSE 'dead' END,
        run_at = CASE WHEN j.attempts < j.max_attempts
                      THEN c.now + jobq_backoff(j.attempts, CAST(:backoff_base AS float8),
                                                CAST(:backoff_cap AS float8))
                      ELSE j.run_at END,
        finished_at = CASE WHEN j.attempts < j.max_attempts THEN NULL ELSE c.now END,
        last_error = r.reason,
        errors = jobq_errors_append(
            j.errors,
            jsonb_build_object('attempt', j.attempts, 'at', c.now, 'error', r.reason,
                               'worker_id', j.worker_id,
                               'kind', CASE WHEN r.timed_out THEN 'timed_out' ELSE 'lease_expired' END),
            CAST(:errors_kept AS int)),
        -- The lease id stays, so a late call with it learns it expired or timed out; as that is
        -- not the caller's own transition it is never taken for a replay.
        lease_ended_by = CASE WHEN r.timed_out THEN 'timeout' ELSE 'expire' END,
        lease_expires_at = NULL,
        updated_at = now()
    FROM reasons r, clock c
    WHERE j.id = r.id AND j.status = 'running' AND j.lease_expires_at < c.now
    RETURNING j.id, j.queue, j.status, j.flow_keys IS NOT NULL AS freed_flow, j.type,
              j.id AS job_id, j.started_at, j.attempts, j.worker_id, j.lease_key_id,
              j.lease_instance, j.run_at, r.timed_out, r.reason
),
events AS (
    INSERT INTO job_events (job_id, at, kind, attempt, actor, actor_key_id, instance, data)
    SELECT f.job_id, e.at, e.kind, f.attempts, f.worker_id, f.lease_key_id, f.lease_instance,
           e.data
    FROM reaped f
    CROSS JOIN LATERAL (VALUES
        (f.started_at, 'claimed', NULL::jsonb),
        (now(), CASE WHEN f.timed_out THEN 'timed_out' ELSE 'lease_expired' END,
         jsonb_build_object('error', f.reason, 'status', f.status,
                            'run_at', CASE WHEN f.status <> 'dead' THEN f.run_at END))
    ) AS e(at, kind, data)
)
SELECT id, queue, status, freed_flow, type FROM reaped

-- fragment: job_reap_expired
-- The clock, and the head of the CTE of the leases a reap takes (its WHERE follows): each job's
-- id and whether its run time passed timeout_seconds.
WITH clock AS (
    SELECT COALESCE(CAST(:now AS timestamptz), now()) AS now
),
expired AS MATERIALIZED (
    SELECT j.id,
           j.timeout_seconds IS NOT NULL
               AND c.now >= j.started_at + make_interval(secs => j.timeout_seconds) AS timed_out
    FROM jobs j, clock c

-- name: job_reap
-- Moves at most :batch_size running jobs whose lease expired (or whose run time passed timeout_seconds) to scheduled after a backoff, or to dead on the last attempt; the attempt's claim and its end go to job_events.
{{ job_reap_expired }}
    -- The bound is written out, not read from clock: a column of a materialized CTE gives the
    -- index walk no bound, and it would read every running job on every tick.
    WHERE j.status = 'running' AND j.lease_expires_at < COALESCE(CAST(:now AS timestamptz), now())
      {{ job_reap_set_aside }}
    ORDER BY j.lease_expires_at
    LIMIT :batch_size
    FOR UPDATE OF j SKIP LOCKED
),
{{ job_reap_move }};

-- name: job_reap_one
-- As job_reap, for the one job :id (when its lease expired): what a failed batch is retried as.
{{ job_reap_expired }}
    WHERE j.id = :id
      AND j.status = 'running' AND j.lease_expires_at < COALESCE(CAST(:now AS timestamptz), now())
    FOR UPDATE OF j SKIP LOCKED
),
{{ job_reap_move }};

-- name: job_reap_candidates
-- The jobs job_reap would take now (at most :batch_size, not locked): the ids a failed batch is retried one by one with.
SELECT j.id, j.queue
FROM jobs j
WHERE j.status = 'running' AND j.lease_expires_at < COALESCE(CAST(:now AS timestamptz), now())
  {{ job_reap_set_aside }}
ORDER BY j.lease_expires_at
LIMIT :batch_size;

-- fragment: job_promote_set_aside
-- Not set aside by the promoter.
AND NOT EXISTS (SELECT 1 FROM maintenance_set_aside s WHERE s.loop = 'promoter' AND s.job_id = jobs.id)

-- fragment: job_promote_move
-- What the promoter does to the due scheduled jobs it locked (CTE due).
promoted AS (
    UPDATE jobs j
    SET status = 'pending', updated_at = now()
    FROM due
    WHERE j.id = due.id AND j.status = 'scheduled'
    RETURNING j.id, j.queue, j.run_at
),
events AS (
    INSERT INTO job_events (job_id, kind, data)
    SELECT id, 'promoted', jsonb_build_object('run_at', run_at) FROM promoted
)
SELECT queue FROM promoted

-- name: job_promote
-- Moves at most :batch_size scheduled jobs whose run_at has come to pending, oldest first, recording each in job_events; answers their queues.
WITH due AS MATERIALIZED (
    SELECT id
    FROM jobs
    WHERE status = 'scheduled' AND run_at <= COALESCE(CAST(:now AS timestamptz), now())
      {{ job_promote_set_aside }}
    ORDER BY run_at
    LIMIT :batch_size
    FOR UPDATE SKIP LOCKED
),
{{ job_promote_move }};

-- name: job_promote_one
-- As job_promote, for the one job :id (when it is due): what a failed batch is retried as.
WITH due AS MATERIALIZED (
    SELECT id
    FROM jobs
    WHERE id = :id
      AND status = 'scheduled' AND run_at <= COALESCE(CAST(:now AS timestamptz), now())
    FOR UPDATE SKIP LOCKED
),
{{ job_promote_move }};

-- name: job_promote_candidates
-- The jobs job_promote would take now (at most :batch_size, not locked).
SELECT id, queue
FROM jobs
WHERE status = 'scheduled' AND run_at <= COALESCE(CAST(:now AS timestamptz), now())
  {{ job_promote_set_aside }}
ORDER BY run_at
LIMIT :batch_size;

-- fragment: job_prune_cutoffs
-- Each finished state's retention, as a cutoff (CTE clock first).
cutoffs AS (
    SELECT s.status, c.now - make_interval(secs => s.retention) AS before
    FROM clock c,
         (VALUES ('succeeded', CAST(:succeeded_seconds AS float8)),
                 ('cancelled', CAST(:cancelled_seconds AS float8)),
                 ('dead', CAST(:dead_seconds AS float8))) AS s(status, retention)
)

-- fragment: job_prune_walk
-- Each state's own range of the finished jobs' index, past its cutoff, not set aside by the pruner.
SELECT d.id, d.queue
FROM cutoffs co
CROSS JOIN LATERAL (
    SELECT j.id, j.queue
    FROM jobs j
    -- The IN list repeats the partial index's predicate, so the planner may use it.
    WHERE j.status IN ('succeeded', 'cancelled', 'dead')
      AND j.status = co.status AND j.finished_at < co.before
      AND NOT EXISTS (SELECT 1 FROM maintenance_set_aside s
                      WHERE s.loop = 'pruner' AND s.job_id = j.id)
    ORDER BY j.status, j.finished_at
    LIMIT :batch_size
    FOR UPDATE SKIP LOCKED
) d
LIMIT :batch_size

-- name: job_prune
-- Deletes at most :batch_size finished jobs whose retention has passed (succeeded, cancelled, dead each have their own), walking each state's own range of the index.
WITH clock AS (
    SELECT COALESCE(CAST(:now AS timestamptz), now()) AS now
),
{{ job_prune_cutoffs }},
doomed AS MATERIALIZED (
    {{ job_prune_walk }}
)
DELETE FROM jobs j
USING doomed
WHERE j.id = doomed.id AND j.status IN ('succeeded', 'cancelled', 'dead')
RETURNING j.id;

-- name: job_prune_one
-- As job_prune, for the one job :id (when its retention has passed): what a failed batch is retried as.
WITH clock AS (
    SELECT COALESCE(CAST(:now AS timestamptz), now()) AS now
),
{{ job_prune_cutoffs }}
DELETE FROM jobs j
USING cutoffs co
WHERE j.id = :id AND j.status IN ('succeeded', 'cancelled', 'dead')
  AND j.status = co.status AND j.finished_at < co.before
RETURNING j.id;

-- name: job_prune_candidates
-- The jobs job_prune would delete now (at most :batch_size; locked only while this runs).
WITH clock AS (
    SELECT COALESCE(CAST(:now AS timestamptz), now()) AS now
),
{{ job_prune_cutoffs }}
{{ job_prune_walk }};

-- name: set_aside_record
-- Records that :loop could not move job :job_id even alone (the error and its SQLSTATE); a second time counts it again.
INSERT INTO maintenance_set_aside AS s (loop, job_id, queue, error, sqlstate)
VALUES (CAST(:loop AS text), CAST(:job_id AS bigint), CAST(:queue AS text),
        CAST(:error AS text), CAST(:sqlstate AS text))
ON CONFLICT (loop, job_id) DO UPDATE
SET failures = s.failures + 1, error = EXCLUDED.error, sqlstate = EXCLUDED.sqlstate,
    last_failed_at = now();

-- name: set_aside_list
-- The jobs set aside, newest failure first (at most :limit), with each job's state now; with :queue_patterns (LIKE), only matching queues.
SELECT s.loop, s.job_id, s.queue, s.error, s.sqlstate, s.failures, s.first_failed_at,
       s.last_failed_at, j.status
FROM maintenance_set_aside s
LEFT JOIN jobs j ON j.id = s.job_id
WHERE CAST(:queue_patterns AS text[]) IS NULL
   OR s.queue LIKE ANY (CAST(:queue_patterns AS text[]))
ORDER BY s.last_failed_at DESC, s.loop, s.job_id
LIMIT :limit;

-- name: set_aside_of_job
-- The loops that set job :id aside, with their errors (for the job's page).
SELECT s.loop, s.job_id, s.queue, s.error, s.sqlstate, s.failures, s.first_failed_at,
       s.last_failed_at, NULL AS status
FROM maintenance_set_aside s
WHERE s.job_id = :id
ORDER BY s.loop;

-- name: set_aside_counts
-- How many jobs each loop has set aside now, per queue (for /metrics).
SELECT loop, COALESCE(queue, '') AS queue, count(*) AS jobs
FROM maintenance_set_aside
GROUP BY 1, 2;

-- name: set_aside_put_back
-- Puts job :job_id back into :loop's batches (deletes its row), recording it in audit_log with :actor; answers the row it deleted.
WITH deleted AS (
    DELETE FROM maintenance_set_aside s
    WHERE s.loop = CAST(:loop AS text) AND s.job_id = CAST(:job_id AS bigint)
    RETURNING s.*
),
audited AS (
    INSERT INTO audit_log (actor, actor_key_id, action, outcome, queue, job_id, detail)
    SELECT CAST(:actor AS text), CAST(:actor_key_id AS bigint), 'maintenance.put_back',
           'changed', d.queue, d.job_id,
           jsonb_build_object('loop', d.loop, 'error', d.error, 'failures', d.failures)
    FROM deleted d
)
SELECT d.loop, d.job_id, d.queue, d.error, d.sqlstate, d.failures, d.first_failed_at,
       d.last_failed_at, NULL AS status
FROM deleted d;

-- name: set_aside_prune
-- Deletes at most :batch_size rows whose job is gone or has left the state its loop moves jobs out of (running, scheduled, finished): nothing is left to set aside.
DELETE FROM maintenance_set_aside s
WHERE (s.loop, s.job_id) IN (
    SELECT s2.loop, s2.job_id
    FROM maintenance_set_aside s2
    LEFT JOIN jobs j ON j.id = s2.job_id
    WHERE j.id IS NULL
       OR (s2.loop = 'reaper' AND j.status <> 'running')
       OR (s2.loop = 'promoter' AND j.status <> 'scheduled')
       OR (s2.loop = 'pruner' AND j.status NOT IN ('succeeded', 'cancelled', 'dead'))
    LIMIT :batch_size
    FOR UPDATE OF s2 SKIP LOCKED
)
RETURNING s.job_id;
