-- Named statements for the control connection and the process itself: wake-up notifications
-- (see app/wakeup/), the maintenance leader lock and the health check.

-- name: wakeup_notify
-- Sends one notification per payload on the wake-up channel, in a transaction that writes nothing.
SELECT pg_notify(CAST(:channel AS text), p) FROM unnest(CAST(:payloads AS text[])) AS p;

-- name: maintenance_try_lead
-- Tries to take the session-level advisory lock that elects the maintenance leader.
SELECT pg_try_advisory_lock(:lock_key) AS acquired;

-- name: health_ping
-- Confirms the database answers.
SELECT 1 AS alive;

-- name: jobs_analyze_due
-- Whether jobq should ANALYZE jobs itself: autovacuum will not (off on the server, or for the table), and rows changed since its last analyze number over 1,000 plus a tenth of the table.
-- The hot pool plans each statement once (force_generic_plan) from these statistics. With none
-- (a server without autovacuum, before any ANALYZE) the planner guesses a queue holds one
-- pending job: measured, claims over a backlog of 40,000 then sorted the whole backlog each
-- time, and the bench's 1 x 50 drain ran at 3,500 jobs/s against 9,400 after an ANALYZE.
-- Where autovacuum runs, it decides alone (jobs asks it to analyze after 2 % changed, 0008).
SELECT (current_setting('autovacuum') = 'off'
        OR EXISTS (SELECT 1 FROM pg_options_to_table(c.reloptions) o
                   WHERE o.option_name = 'autovacuum_enabled'
                     AND o.option_value IN ('false', 'off', 'no', '0')))
       AND s.n_mod_since_analyze >= 1000 + 0.1 * GREATEST(c.reltuples, 0) AS due
FROM pg_class c
JOIN pg_stat_user_tables s ON s.relid = c.oid
WHERE c.oid = CAST('jobs' AS regclass);

-- name: jobs_analyze
-- Refreshes the planner's statistics of jobs (a sample of the table; takes no lock that blocks reads or writes).
ANALYZE jobs;
