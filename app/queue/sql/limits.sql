-- Named statements for concurrency and rate limits (migration 0011). The claim statement that
-- enforces them is job_claim in jobs.sql; these manage the limits and tidy flow_state.

-- name: flow_limit_list
-- Lists the limits with, per limit, how many of its keys or queues run jobs now and the busiest ones.
SELECT l.*,
       (SELECT COALESCE(sum(f.running), 0)::bigint FROM flow_state f
        WHERE f.key LIKE l.scope || ':' || l.like_pattern) AS running
FROM flow_limits l
ORDER BY l.scope, l.pattern;

-- name: flow_limit_set
-- Creates or replaces the limit of (scope, pattern); clears the limit hints of the flow_state rows it covers, so the next claim applies the new values; answers the limit and whether it was new.
WITH upserted AS (
    INSERT INTO flow_limits AS l (scope, pattern, like_pattern, max_running, rate_limit,
                                  rate_per_seconds)
    VALUES (:scope, :pattern, :like_pattern, :max_running, :rate_limit, :rate_per_seconds)
    ON CONFLICT (scope, pattern) DO UPDATE
    SET max_running = EXCLUDED.max_running,
        rate_limit = EXCLUDED.rate_limit,
        rate_per_seconds = EXCLUDED.rate_per_seconds,
        updated_at = now()
    RETURNING l.*, (xmax = 0) AS created
),
hints AS (
    UPDATE flow_state f
    SET max_running = NULL, rate_limit = NULL, rate_per_seconds = NULL, blocked_until = NULL
    WHERE f.key LIKE CAST(:scope AS text) || ':' || CAST(:like_pattern AS text)
)
SELECT * FROM upserted;

-- name: flow_limit_delete
-- Deletes one limit; clears the hints of the flow_state rows it covered (running slots already held are still given back by the trigger); answers the deleted limit.
WITH deleted AS (
    DELETE FROM flow_limits WHERE id = :id RETURNING *
),
hints AS (
    UPDATE flow_state f
    SET max_running = NULL, rate_limit = NULL, rate_per_seconds = NULL, blocked_until = NULL
    FROM deleted d
    WHERE f.key LIKE d.scope || ':' || d.like_pattern
)
SELECT * FROM deleted;

-- name: flow_state_prune
-- Deletes at most :batch_size idle flow_state rows (nothing running, untouched for :idle_seconds and longer than their bucket takes to refill); answers how many.
WITH idle AS (
    SELECT f.key FROM flow_state f
    WHERE f.running = 0
      AND f.updated_at < COALESCE(CAST(:now AS timestamptz), now())
                         - make_interval(secs => CAST(:idle_seconds AS float8))
      AND f.refilled_at < COALESCE(CAST(:now AS timestamptz), now())
                          - make_interval(secs => COALESCE(f.rate_per_seconds, 0))
    LIMIT :batch_size
    FOR UPDATE SKIP LOCKED
)
DELETE FROM flow_state f
USING idle
WHERE f.key = idle.key AND f.running = 0
RETURNING f.key;
