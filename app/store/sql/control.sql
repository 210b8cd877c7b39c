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
