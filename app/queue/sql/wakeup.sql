-- Named statements for long-poll wake-ups (see app/wakeup/). Run on the control connection or,
-- for the promoter, on the pool; never inside an enqueue transaction.

-- name: wakeup_notify
-- Sends one notification per payload on the wake-up channel, in a transaction that writes nothing.
SELECT pg_notify(CAST(:channel AS text), p) FROM unnest(CAST(:payloads AS text[])) AS p;

-- name: job_due_since
-- Counts, per queue, pending jobs that came due after :since (delayed jobs and retries); answers the check time.
SELECT queue, count(*) AS due, now() AS checked_at
FROM jobs
WHERE status = 'pending' AND run_at > COALESCE(CAST(:since AS timestamptz), now()) AND run_at <= now()
GROUP BY queue
UNION ALL
SELECT NULL, 0, now();
