-- Named statements for queues: their switch (the queues table, each change recorded in
-- audit_log), the trigger-kept counters, the per-minute outcomes and the figures of a window's
-- finished jobs (rates, wait and run percentiles). app/store/queues.py (QueueStore) is the only
-- caller.

-- name: queue_put
-- Creates a queue or sets a known one's switch (:paused NULL keeps it; a new queue is active) and, when :set_callback, its default callback_url (NULL clears it), recording it in audit_log: queue.create for a queue with neither a row nor jobs before, else queue.pause / queue.resume (queue.create when only the callback or nothing changed, unchanged when nothing did; the callback set is in detail); answers whether it was created.
-- The row is locked first, as in queue_set_paused. Whether this call inserted the row is read
-- from xmax (0 for a row this statement inserted, not one it updated), so of two first PUTs at
-- once only one answers created. A queue known only by its jobs gets a row and is not created.
WITH prior AS (
    SELECT r.paused AS row_paused, r.callback_url AS row_callback,
           (SELECT COALESCE(sum(jobs), 0) FROM queue_counts WHERE queue = :name) AS jobs
    FROM (SELECT 1) one
    LEFT JOIN (SELECT paused, callback_url FROM queues WHERE name = :name FOR UPDATE) r ON true
),
saved AS (
    INSERT INTO queues AS q (name, paused, callback_url)
    SELECT CAST(:name AS text), COALESCE(CAST(:paused AS boolean), p.row_paused, false),
           CASE WHEN CAST(:set_callback AS boolean) THEN CAST(:callback_url AS text)
                ELSE p.row_callback END
    FROM prior p
    ON CONFLICT (name) DO UPDATE
        SET paused = COALESCE(CAST(:paused AS boolean), q.paused),
            callback_url = EXCLUDED.callback_url,
            updated_at = CASE WHEN q.paused = COALESCE(CAST(:paused AS boolean), q.paused)
                                   AND q.callback_url IS NOT DISTINCT FROM EXCLUDED.callback_url
                              THEN q.updated_at ELSE now() END
    RETURNING q.name, q.paused, q.updated_at, q.callback_url, q.xmax = 0 AS inserted
),
decided AS (
    SELECT s.name, s.paused, s.updated_at, s.callback_url, s.inserted AND p.jobs = 0 AS created,
           COALESCE(p.row_paused, false) AS was_paused,
           s.callback_url IS DISTINCT FROM p.row_callback AS callback_changed
    FROM saved s CROSS JOIN prior p
),
audited AS (
    INSERT INTO audit_log (actor, actor_key_id, action, outcome, queue, state_before, state_after,
                           detail)
    SELECT CAST(:actor AS text), CAST(:actor_key_id AS bigint),
           CASE WHEN d.created OR d.was_paused = d.paused THEN 'queue.create'
                WHEN d.paused THEN 'queue.pause' ELSE 'queue.resume' END,
           CASE WHEN d.created OR d.was_paused <> d.paused OR d.callback_changed THEN 'changed'
                ELSE 'unchanged' END,
           d.name,
           CASE WHEN d.created THEN NULL WHEN d.was_paused THEN 'paused' ELSE 'active' END,
           CASE WHEN d.paused THEN 'paused' ELSE 'active' END,
           CASE WHEN d.callback_changed THEN jsonb_build_object('callback_url', d.callback_url) END
    FROM decided d
)
SELECT name, paused, updated_at, callback_url, created FROM decided;

-- name: queue_delete
-- Deletes a queue's row while no job (of any state) names the queue, recording queue.delete in audit_log; answers whether the queue had a row, its unfinished and finished jobs, and whether it was deleted.
-- A job enqueued at the moment of the delete brings the queue back, active: enqueues do not
-- take the queue's row lock, so that the hot path never waits on an ops action.
WITH target AS (
    SELECT name, paused FROM queues WHERE name = :name FOR UPDATE
),
held AS (
    SELECT COALESCE(sum(jobs) FILTER (WHERE status NOT IN ('succeeded', 'dead', 'cancelled')), 0)::bigint
               AS unfinished,
           COALESCE(sum(jobs) FILTER (WHERE status IN ('succeeded', 'dead', 'cancelled')), 0)::bigint
               AS finished
    FROM queue_counts
    WHERE queue = :name
),
removed AS (
    DELETE FROM queues q
    USING target t, held h
    WHERE q.name = t.name AND h.unfinished = 0 AND h.finished = 0
    RETURNING q.name, t.paused
),
audited AS (
    INSERT INTO audit_log (actor, actor_key_id, action, outcome, queue, state_before, state_after)
    SELECT CAST(:actor AS text), CAST(:actor_key_id AS bigint), 'queue.delete', 'changed', r.name,
           CASE WHEN r.paused THEN 'paused' ELSE 'active' END, NULL
    FROM removed r
)
SELECT EXISTS (SELECT 1 FROM target) AS known, h.unfinished, h.finished,
       EXISTS (SELECT 1 FROM removed) AS deleted
FROM held h;

-- name: queue_set_paused
-- Pauses or resumes a known queue (one with a row or with jobs), recording it in audit_log (unchanged when it already was); no row back when the queue is unknown. Claims skip paused queues.
-- The queue's row is locked first, and the upsert reads from that lock's result so it runs after
-- it: the state recorded as before is the one this call changed. A queue known only by its jobs
-- has no row: it was active (two first pauses of such a queue at once may both record
-- active -> paused). A name neither created nor used by a job is refused, so a typo leaves no
-- queue behind.
WITH prior AS (
    SELECT (SELECT paused FROM queues WHERE name = :name FOR UPDATE) AS row_paused,
           (SELECT COALESCE(sum(jobs), 0) FROM queue_counts WHERE queue = :name) AS jobs
),
saved AS (
    INSERT INTO queues (name, paused)
    SELECT CAST(:name AS text), CAST(:paused AS boolean) FROM prior
    WHERE row_paused IS NOT NULL OR jobs <> 0
    ON CONFLICT (name) DO UPDATE SET paused = EXCLUDED.paused, updated_at = now()
    RETURNING name, paused, updated_at, callback_url
),
audited AS (
    INSERT INTO audit_log (actor, actor_key_id, action, outcome, queue, state_before, state_after)
    SELECT CAST(:actor AS text), CAST(:actor_key_id AS bigint),
           CASE WHEN s.paused THEN 'queue.pause' ELSE 'queue.resume' END,
           CASE WHEN COALESCE(p.row_paused, false) = s.paused THEN 'unchanged' ELSE 'changed' END,
           s.name,
           CASE WHEN COALESCE(p.row_paused, false) THEN 'paused' ELSE 'active' END,
           CASE WHEN s.paused THEN 'paused' ELSE 'active' END
    FROM saved s CROSS JOIN prior p
)
SELECT name, paused, updated_at, callback_url FROM saved;

-- name: queue_stats
-- Per queue: jobs per state from the trigger-kept counters, how many scheduled ones are retrying, the age of the oldest pending job (one index probe a priority) and last minute's successes.
WITH counts AS (
    SELECT queue,
           sum(jobs) FILTER (WHERE status = 'scheduled') AS scheduled,
           sum(jobs) FILTER (WHERE status = 'pending') AS pending,
           sum(jobs) FILTER (WHERE status = 'running') AS running,
           sum(jobs) FILTER (WHERE status = 'succeeded') AS succeeded,
           sum(jobs) FILTER (WHERE status = 'dead') AS dead,
           sum(jobs) FILTER (WHERE status = 'cancelled') AS cancelled,
           sum(jobs) FILTER (WHERE status = 'waiting') AS waiting,
           sum(jobs) AS total
    FROM queue_counts
    GROUP BY queue
),
names AS (
    SELECT queue AS name FROM counts WHERE total <> 0
    UNION
    SELECT name FROM queues
)
SELECT n.name,
       COALESCE(q.paused, false) AS paused,
       q.callback_url,
       COALESCE(c.scheduled, 0)::bigint AS scheduled,
       -- An index-only count over ix_jobs_retrying: its rows are this queue's retrying jobs.
       (SELECT count(*) FROM jobs j
        WHERE j.queue = n.name AND j.status = 'scheduled'
          AND j.lease_ended_by IN ('fail', 'expire', 'timeout'))::bigint AS retrying,
       COALESCE(c.pending, 0)::bigint AS pending,
       COALESCE(c.running, 0)::bigint AS running,
       COALESCE(c.succeeded, 0)::bigint AS succeeded,
       COALESCE(c.dead, 0)::bigint AS dead,
       COALESCE(c.cancelled, 0)::bigint AS cancelled,
       COALESCE(c.waiting, 0)::bigint AS waiting,
       -- The oldest pending job is the oldest head among the queue's priorities: a loose walk
       -- of ix_jobs_claimable, one probe a priority that has pending jobs (the claim's index
       -- is the only one over pending jobs, migration 0024).
       (WITH RECURSIVE heads AS (
            (SELECT j.priority, j.run_at FROM jobs j
             WHERE j.queue = n.name AND j.status = 'pending'
             ORDER BY j.priority DESC, j.run_at, j.id
             LIMIT 1)
            UNION ALL
            SELECT nx.priority, nx.run_at
            FROM heads h
            CROSS JOIN LATERAL (
                SELECT j.priority, j.run_at FROM jobs j
                WHERE j.queue = n.name AND j.status = 'pending' AND j.priority < h.priority
                ORDER BY j.priority DESC, j.run_at, j.id
                LIMIT 1) nx
        )
        SELECT GREATEST(EXTRACT(EPOCH FROM now() - o.run_at), 0)::float8
        FROM (SELECT min(run_at) AS run_at FROM heads) o
        WHERE o.run_at IS NOT NULL) AS oldest_pending_age_seconds,
       -- The last 60 s, estimated from two minute buckets: all of this minute's, and the part of
       -- the previous minute's that still lies inside the window.
       COALESCE((SELECT round(sum(t.jobs * CASE WHEN t.minute = date_trunc('minute', now()) THEN 1
                                                ELSE 1 - EXTRACT(EPOCH FROM now() - date_trunc('minute', now())) / 60
                                           END))
                 FROM queue_throughput t
                 WHERE t.queue = n.name AND t.outcome = 'succeeded'
                   AND t.minute >= date_trunc('minute', now()) - interval '1 minute'), 0)::bigint
           AS succeeded_last_minute
FROM names n
LEFT JOIN queues q ON q.name = n.name
LEFT JOIN counts c ON c.queue = n.name
ORDER BY n.name;

-- name: queue_throughput
-- Outcomes (succeeded, failed, dead, cancelled) per queue and minute over the last :minutes minutes, the current one included, summed over the sums and the journal slots.
SELECT t.queue, t.minute, t.outcome, sum(t.jobs)::bigint AS jobs
FROM queue_throughput t
WHERE t.minute > date_trunc('minute', now()) - make_interval(mins => CAST(:minutes AS int))
GROUP BY t.queue, t.minute, t.outcome
ORDER BY t.queue, t.minute, t.outcome;

-- name: counter_journal_turn
-- Turns the counter triggers over to the other journal slot (1 <-> 2); answers the slot they append to now.
-- Committed on its own before counter_journal_fold, so that the fold's lock on the slot left
-- behind waits only for the transactions that appended to it before the turn, while new ones
-- append to the other slot (migration 0028).
UPDATE counter_journal_slot SET slot = 3 - slot RETURNING slot;

-- name: counter_journal_fold
-- Adds the journal slot that is not current into the sums (slot 0) and empties it with TRUNCATE, in one transaction, waiting at most :lock_timeout_ms for the transactions still appending to it; answers the rows folded (the larger journal's), or NULL when the wait ran out.
-- jobq_counters_fold() (app/store/sql/schema/counters.sql): the slot is locked, summed and truncated under one
-- ACCESS EXCLUSIVE lock, so a reader sees the rows or their sums and none is lost or counted
-- twice; no row is deleted, so the journal leaves no dead tuple.
SELECT jobq_counters_fold(CAST(:lock_timeout_ms AS integer)) AS folded;

-- name: queue_throughput_prune
-- Deletes at most :batch_size per-minute outcome sums (slot 0) older than :keep_seconds.
-- Only the sums: a journal slot is emptied by the fold, and an old row there is pruned once
-- folded.
DELETE FROM queue_throughput_totals t
WHERE (t.queue, t.minute, t.outcome) IN (
    SELECT queue, minute, outcome
    FROM queue_throughput_totals
    WHERE minute < COALESCE(CAST(:now AS timestamptz), now()) - make_interval(secs => CAST(:keep_seconds AS float8))
    ORDER BY minute
    LIMIT :batch_size
)
RETURNING t.minute;

-- name: queue_window_stats
-- One queue's finished jobs in each window of :windows (seconds back from :now, default now()), in that order: how many succeeded, went dead or were cancelled, their attempts and failed attempts, and the p50 / p95 / p99 of the wait (due -> claim) and the run (claim -> the worker's complete or fail) of each job's last attempt; read from the queue's newest finished jobs, at most :scan of each state.
-- Bounded reads, whatever the history: each state's newest jobs are walked in
-- ix_jobs_queue_status_id (the state as a range of one value, ordered by (state, id): only that
-- index yields the order, so the planner cannot walk the primary key newest first and filter,
-- which passes the whole history for a quiet queue). Dead and cancelled jobs are read only as
-- far back as the succeeded ones reach when those fill :scan. The sample is then every finished
-- job of the queue above the highest cut a full state made: all states over one id range, so
-- the rates compare like with like. A window is truncated when a state was cut and the oldest
-- job kept (the lowest id) finished inside it: the window may hold jobs older than the walk
-- reached (ids follow enqueue order, so this is a close reading, not a proof).
-- Wait is due (run_at: the enqueue, or the end of a delay or a retry's backoff) to claim
-- (started_at), as jobq_job_wait_duration_seconds measures it; a job that ran once waited from
-- its enqueue to its first claim. Run time leaves out attempts the reaper ended (their end is
-- when it looked).
WITH succeeded AS MATERIALIZED (
    SELECT j.id, j.status, j.attempts, j.lease_ended_by, j.run_at, j.started_at, j.finished_at
    FROM jobs j
    WHERE j.queue = :queue AND j.status >= 'succeeded' AND j.status <= 'succeeded'
    ORDER BY j.status DESC, j.id DESC
    LIMIT :scan
),
reach AS MATERIALIZED (
    SELECT CASE WHEN count(*) >= :scan THEN min(id) ELSE 0 END AS id FROM succeeded
),
others AS MATERIALIZED (
    SELECT o.*
    FROM (VALUES ('dead'), ('cancelled')) AS s(status)
    CROSS JOIN LATERAL (
        SELECT j.id, j.status, j.attempts, j.lease_ended_by, j.run_at, j.started_at, j.finished_at
        FROM jobs j
        WHERE j.queue = :queue AND j.status >= s.status AND j.status <= s.status
          AND j.id >= (SELECT id FROM reach)
        ORDER BY j.status DESC, j.id DESC
        LIMIT :scan
    ) o
),
cut AS MATERIALIZED (
    SELECT GREATEST((SELECT id FROM reach),
                    (SELECT COALESCE(max(low), 0)
                     FROM (SELECT min(id) AS low FROM others
                           GROUP BY status HAVING count(*) >= :scan) full_states)) AS id,
           (SELECT count(*) FROM succeeded) + (SELECT count(*) FROM others) AS scanned
),
sample AS MATERIALIZED (
    SELECT r.id, r.status, r.attempts, r.lease_ended_by, r.finished_at,
           GREATEST(EXTRACT(EPOCH FROM r.started_at - r.run_at), 0)::float8 AS waited,
           EXTRACT(EPOCH FROM r.finished_at - r.started_at)::float8 AS ran
    FROM (SELECT * FROM succeeded UNION ALL SELECT * FROM others) r
    WHERE r.id >= (SELECT id FROM cut)
),
windows AS (
    SELECT w.seconds, w.ord,
           COALESCE(CAST(:now AS timestamptz), now()) - make_interval(secs => w.seconds) AS since
    FROM unnest(CAST(:windows AS float8[])) WITH ORDINALITY AS w(seconds, ord)
),
figures AS (
    SELECT w.ord, w.seconds, w.since,
           count(*) FILTER (WHERE s.status = 'succeeded') AS succeeded,
           count(*) FILTER (WHERE s.status = 'dead') AS dead,
           count(*) FILTER (WHERE s.status = 'cancelled') AS cancelled,
           COALESCE(sum(s.attempts) FILTER (WHERE s.status IN ('succeeded', 'dead')), 0)
               AS attempts,
           -- A job that succeeded failed every attempt but its last; a dead one, every attempt.
           COALESCE(sum(CASE WHEN s.status = 'succeeded' THEN s.attempts - 1 ELSE s.attempts END)
                        FILTER (WHERE s.status IN ('succeeded', 'dead')), 0) AS failed_attempts,
           count(s.waited) FILTER (WHERE s.status IN ('succeeded', 'dead')) AS wait_jobs,
           percentile_cont(ARRAY[0.5, 0.95, 0.99]) WITHIN GROUP (ORDER BY s.waited)
               FILTER (WHERE s.status IN ('succeeded', 'dead')) AS waits,
           count(s.ran) FILTER (WHERE s.lease_ended_by IN ('complete', 'fail')) AS run_jobs,
           percentile_cont(ARRAY[0.5, 0.95, 0.99]) WITHIN GROUP (ORDER BY s.ran)
               FILTER (WHERE s.lease_ended_by IN ('complete', 'fail')) AS runs
    FROM windows w
    LEFT JOIN sample s ON s.finished_at >= w.since
    GROUP BY w.ord, w.seconds, w.since
)
SELECT CAST(:queue AS text) AS queue,
       EXISTS (SELECT 1 FROM queues q WHERE q.name = CAST(:queue AS text))
           OR (SELECT COALESCE(sum(jobs), 0) FROM queue_counts
               WHERE queue = CAST(:queue AS text)) <> 0 AS known,
       f.seconds AS window_seconds, f.since,
       f.succeeded, f.dead, f.cancelled, f.attempts::bigint AS attempts,
       f.failed_attempts::bigint AS failed_attempts,
       f.wait_jobs, f.waits[1] AS wait_p50, f.waits[2] AS wait_p95, f.waits[3] AS wait_p99,
       f.run_jobs, f.runs[1] AS run_p50, f.runs[2] AS run_p95, f.runs[3] AS run_p99,
       c.scanned,
       -- The walk stopped at a job that finished inside the window: older ones may have too.
       c.id > 0 AND COALESCE((SELECT finished_at FROM sample ORDER BY id LIMIT 1) >= f.since,
                             true) AS truncated
FROM figures f
CROSS JOIN cut c
ORDER BY f.ord;
