-- Named statements for long-poll wake-ups (see app/wakeup/). Run on the control connection or,
-- for the backstop, on the pool; never inside an enqueue transaction.

-- name: wakeup_notify
-- Sends one notification per payload on the wake-up channel, in a transaction that writes nothing.
SELECT pg_notify(CAST(:channel AS text), p) FROM unnest(CAST(:payloads AS text[])) AS p;

-- name: job_due_in_queues
-- Counts (up to :cap) due pending jobs in each of the given unpaused queues, for the long-poll backstop.
SELECT q.name AS queue,
       (SELECT count(*) FROM (
            SELECT 1 FROM jobs j
            WHERE j.queue = q.name AND j.status = 'pending' AND j.run_at <= now()
            -- Ordered as ix_jobs_pending_queue_run_at is: a walk of this queue's due rows only.
            ORDER BY j.queue, j.run_at
            LIMIT :cap) due_rows) AS due
FROM unnest(CAST(:queues AS text[])) AS q(name)
WHERE NOT EXISTS (SELECT 1 FROM queues p WHERE p.name = q.name AND p.paused);
