-- Named statements for concurrency and rate limits (migration 0011); app/store/flow_limits.py
-- (FlowLimitStore) is the only caller. The claim statement that
-- enforces them is job_claim_limited in jobs.sql; these manage the limits and tidy flow_state.
-- A key's jobs are counted per queue: its row is "key:<queue>|<concurrency_key>" (queue names
-- hold no "|"), so the producers of one queue can never use up another queue's slots or tokens.
-- Clearing a row's hints is always safe: the claim locks the row, finds the limit's values and
-- writes the hints back.

-- name: flow_limit_list
-- Lists the limits with, per limit, how many jobs run now in the keys or queues it governs (each row counted under the one limit that applies to it: the longest matching pattern).
WITH busy AS (
    -- Key rows are "key:<queue>|<concurrency_key>" (rows of releases before 0014:
    -- "key:<concurrency_key>"), queue rows "queue:<name>"; only rows running jobs count.
    SELECT f.running,
           CASE WHEN starts_with(f.key, 'queue:') THEN 'queue' ELSE 'key' END AS scope,
           CASE WHEN starts_with(f.key, 'queue:') THEN substr(f.key, 7)
                WHEN strpos(f.key, '|') > 0 THEN substr(f.key, strpos(f.key, '|') + 1)
                ELSE substr(f.key, 5) END AS name
    FROM flow_running f
    WHERE f.running > 0
),
governed AS (
    SELECT best.id, sum(b.running)::bigint AS running
    FROM busy b
    CROSS JOIN LATERAL (
        SELECT l.id FROM flow_limits l
        WHERE l.scope = b.scope AND b.name LIKE l.like_pattern
        ORDER BY length(l.pattern) DESC, l.id
        LIMIT 1
    ) best
    GROUP BY best.id
)
SELECT l.*, COALESCE(g.running, 0)::bigint AS running
FROM flow_limits l
LEFT JOIN governed g ON g.id = l.id
ORDER BY l.scope, l.pattern;

-- name: flow_limit_held_back
-- Per limit, the pending jobs it holds back now: those of the keys or queues at their max_running or with an empty bucket (each counted up to :cap), under the one limit that applies (the longest matching pattern).
WITH blocked AS (
    SELECT CASE WHEN starts_with(f.key, 'queue:') THEN 'queue' ELSE 'key' END AS scope,
           CASE WHEN starts_with(f.key, 'queue:') THEN substr(f.key, 7)
                ELSE split_part(substr(f.key, 5), '|', 1) END AS queue,
           CASE WHEN starts_with(f.key, 'queue:') THEN NULL
                ELSE substr(f.key, strpos(f.key, '|') + 1) END AS concurrency_key
    FROM flow_state f
    -- Both partial indexes of flow_state: only rows that hold jobs back are read. Key rows of
    -- releases before 0014 ("key:<concurrency_key>") name no queue: left out.
    -- A full row with slots given back since (flow_released) is not full any more.
    WHERE ((f.at_limit AND NOT EXISTS (SELECT 1 FROM flow_released r WHERE r.key = f.key))
           OR f.blocked_until > now())
      AND (starts_with(f.key, 'queue:') OR strpos(f.key, '|') > 0)
),
counted AS (
    SELECT b.scope, COALESCE(b.concurrency_key, b.queue) AS name,
           (SELECT count(*) FROM (
                SELECT 1 FROM jobs j
                WHERE j.status = 'pending' AND j.queue = b.queue
                  AND (b.concurrency_key IS NULL OR j.concurrency_key = b.concurrency_key)
                LIMIT :cap) w) AS jobs
    FROM blocked b
)
SELECT best.id, sum(c.jobs)::bigint AS jobs
FROM counted c
CROSS JOIN LATERAL (
    SELECT l.id FROM flow_limits l
    WHERE l.scope = c.scope AND c.name LIKE l.like_pattern
    ORDER BY length(l.pattern) DESC, l.id
    LIMIT 1
) best
GROUP BY best.id;

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
covered AS (
    -- Locked in key order first, as a claim that waits for rows locks them (flow_state_lock),
    -- so the two never deadlock.
    SELECT f.key FROM flow_state f
    WHERE CASE WHEN CAST(:scope AS text) = 'queue'
               THEN f.key LIKE 'queue:' || CAST(:like_pattern AS text)
               ELSE starts_with(f.key, 'key:')
                    AND substr(f.key, strpos(f.key, '|') + 1) LIKE CAST(:like_pattern AS text)
          END
    ORDER BY f.key
    FOR UPDATE
),
hints AS (
    UPDATE flow_state f
    SET max_running = NULL, rate_limit = NULL, rate_per_seconds = NULL, blocked_until = NULL
    WHERE f.key IN (SELECT key FROM covered)
)
SELECT * FROM upserted;

-- name: flow_limit_delete
-- Deletes one limit; clears the hints of the flow_state rows it covered (running slots already held are still given back by the trigger); answers the deleted limit.
WITH deleted AS (
    DELETE FROM flow_limits WHERE id = :id RETURNING *
),
covered AS (
    -- In key order, as flow_limit_set locks them.
    SELECT f.key FROM flow_state f, deleted d
    WHERE CASE WHEN d.scope = 'queue'
               THEN f.key LIKE 'queue:' || d.like_pattern
               ELSE starts_with(f.key, 'key:')
                    AND substr(f.key, strpos(f.key, '|') + 1) LIKE d.like_pattern
          END
    ORDER BY f.key
    FOR UPDATE OF f
),
hints AS (
    UPDATE flow_state f
    SET max_running = NULL, rate_limit = NULL, rate_per_seconds = NULL, blocked_until = NULL
    WHERE f.key IN (SELECT key FROM covered)
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

-- name: flow_released_fold
-- Folds the given-back slots of at most :batch_size keys into their flow_state rows (those no claim holds now: a claim folds its own), so the journal stays small where no claim comes; answers the keys folded.
WITH keys AS (
    SELECT f.key FROM flow_state f
    WHERE f.key IN (SELECT DISTINCT r.key FROM flow_released r LIMIT :batch_size)
    ORDER BY f.key
    FOR UPDATE SKIP LOCKED
),
released AS (
    DELETE FROM flow_released r WHERE r.key IN (SELECT key FROM keys) RETURNING r.key, r.n
)
UPDATE flow_state f
SET running = GREATEST(f.running - s.n, 0), updated_at = now()
FROM (SELECT key, sum(n)::int AS n FROM released GROUP BY key) s
WHERE f.key = s.key
RETURNING f.key;

-- name: flow_state_lock
-- Locks the given flow_state rows in key order, waiting for the transactions that hold them: a claim that found them held runs after this, in the same transaction, so it takes their jobs instead of skipping them again.
SELECT f.key FROM flow_state f
WHERE f.key = ANY (CAST(:keys AS text[]))
ORDER BY f.key
FOR UPDATE;

-- name: flow_state_create
-- Creates the flow_state rows a claim found missing, in key order, as idle rows (nothing running, a full bucket); rows that exist by now are left alone.
INSERT INTO flow_state (key)
SELECT k FROM unnest(CAST(:keys AS text[])) AS k ORDER BY k
ON CONFLICT (key) DO NOTHING;
