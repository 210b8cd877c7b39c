-- Named statements for completion webhooks (migration 0020): the deliveries the row trigger
-- jobs_webhook_finished writes when a job with a callback finishes, and the signing secrets of
-- the API keys. app/store/webhooks.py (WebhookStore) is the only caller; the delivery loop
-- (app/maintenance/webhooks.py) runs them through app/queue/webhooks.py.
-- A delivery being sent is leased, as a job is: taking it counts the attempt and moves
-- next_attempt_at ahead by the in-flight time, so no other instance takes it meanwhile, and a
-- crashed sender's delivery comes due again when that time is over. Recording an attempt is one
-- conditional UPDATE on (id, attempts, pending): the attempt number is the lease, so a sender
-- whose delivery was taken again records nothing.
-- Statements take an optional :now (NULL: the database's now()), so tests are exact at the edges.

-- name: webhook_delivery_take
-- Leases up to :batch_size due pending deliveries, oldest due first, skipping rows others hold: counts the attempt, moves next_attempt_at :in_flight_seconds ahead, and answers each with its body as text, the key's secret and, within :grace_seconds of a rotation, the previous one.
WITH moment AS (
    SELECT COALESCE(CAST(:now AS timestamptz), now()) AS now
),
due AS (
    SELECT d.id
    FROM webhook_deliveries d
    WHERE d.state = 'pending' AND d.next_attempt_at <= (SELECT now FROM moment)
    ORDER BY d.next_attempt_at
    LIMIT :batch_size
    FOR UPDATE SKIP LOCKED
),
taken AS (
    UPDATE webhook_deliveries d
    SET attempts = d.attempts + 1,
        next_attempt_at = m.now + make_interval(secs => CAST(:in_flight_seconds AS float8)),
        updated_at = m.now
    FROM due, moment m
    WHERE d.id = due.id
    RETURNING d.id, d.job_id, d.url, d.key_id, d.body, d.attempts, d.created_at, m.now AS taken_at
)
SELECT t.id, t.job_id, t.url, t.key_id, t.body::text AS body, t.attempts, t.created_at,
       t.taken_at, k.webhook_secret AS secret,
       CASE WHEN k.webhook_secret_rotated_at
                 > t.taken_at - make_interval(secs => CAST(:grace_seconds AS float8))
            THEN k.webhook_secret_previous END AS previous_secret
FROM taken t
LEFT JOIN api_keys k ON k.id = t.key_id
ORDER BY t.id;

-- name: webhook_delivery_record
-- Records attempt :attempt of a delivery still leased by it (delivered; retry after an exponential backoff with jitter, the last at :give_up_seconds after the finish; or failed) and appends it to the job's history; no row back when the delivery was taken again meanwhile.
-- The backoff is half of min(:backoff_cap, :backoff_base x 2^(attempt - 1)) plus a random part
-- of the other half. An attempt made at or after the give-up time fails the delivery, and so
-- does an outcome the caller says is final (:outcome failed, e.g. a refused address).
WITH moment AS (
    SELECT COALESCE(CAST(:now AS timestamptz), now()) AS now
),
planned AS (
    SELECT d.id, m.now,
           d.created_at + make_interval(secs => CAST(:give_up_seconds AS float8)) AS give_up_at,
           m.now + make_interval(secs => LEAST(CAST(:backoff_cap AS float8),
                                               CAST(:backoff_base AS float8)
                                               * 2 ^ LEAST(GREATEST(d.attempts - 1, 0), 40))
                                         * (0.5 + random() / 2)) AS retry_at
    FROM webhook_deliveries d CROSS JOIN moment m
    WHERE d.id = CAST(:id AS uuid)
),
updated AS (
    UPDATE webhook_deliveries d
    SET state = CASE WHEN CAST(:outcome AS text) = 'delivered' THEN 'delivered'
                     WHEN CAST(:outcome AS text) = 'failed' OR p.now >= p.give_up_at THEN 'failed'
                     ELSE 'pending' END,
        next_attempt_at = CASE WHEN CAST(:outcome AS text) = 'retry' AND p.now < p.give_up_at
                               THEN LEAST(p.retry_at, p.give_up_at)
                               ELSE d.next_attempt_at END,
        last_status = CAST(:status AS int),
        last_error = left(CAST(:error AS text), 2000),
        delivered_at = CASE WHEN CAST(:outcome AS text) = 'delivered' THEN p.now END,
        updated_at = p.now
    FROM planned p
    WHERE d.id = p.id AND d.attempts = CAST(:attempt AS int) AND d.state = 'pending'
    RETURNING d.id, d.job_id, d.url, d.state, d.attempts, d.next_attempt_at, d.last_status,
              d.last_error, d.body, p.now
),
recorded AS (
    -- Only while the job exists: a deleted job's history is gone, and nothing would delete it.
    INSERT INTO job_events (job_id, at, kind, attempt, instance, data)
    SELECT u.job_id, u.now, 'webhook', (u.body->>'attempts')::int, CAST(:instance AS text),
           jsonb_strip_nulls(jsonb_build_object(
               'delivery_id', u.id,
               'delivery_attempt', u.attempts,
               'url', u.url,
               'outcome', CASE WHEN u.state = 'pending' THEN 'retrying' ELSE u.state END,
               'status_code', u.last_status,
               'error', u.last_error,
               'job_status', u.body->>'status',
               'next_attempt_at', CASE WHEN u.state = 'pending' THEN u.next_attempt_at END))
    FROM updated u
    WHERE EXISTS (SELECT 1 FROM jobs j WHERE j.id = u.job_id)
)
SELECT u.id, u.job_id, u.state, u.attempts, u.next_attempt_at,
       u.body->>'queue' AS queue, u.body->>'type' AS type
FROM updated u;

-- name: webhook_delivery_list
-- A job's deliveries, oldest first (at most :limit).
SELECT d.id, d.job_id, d.url, d.state, d.attempts, d.next_attempt_at, d.last_status,
       d.last_error, d.created_at, d.delivered_at, d.updated_at
FROM webhook_deliveries d
WHERE d.job_id = :job_id
ORDER BY d.created_at, d.id
LIMIT :limit;

-- name: webhook_delivery_prune
-- Deletes at most :batch_size delivered or failed deliveries last changed more than :keep_seconds before :now; answers their ids.
WITH old AS (
    SELECT d.id
    FROM webhook_deliveries d
    WHERE d.state <> 'pending'
      AND d.updated_at < COALESCE(CAST(:now AS timestamptz), now())
                         - make_interval(secs => CAST(:keep_seconds AS float8))
    ORDER BY d.updated_at
    LIMIT :batch_size
    FOR UPDATE SKIP LOCKED
)
DELETE FROM webhook_deliveries d
USING old
WHERE d.id = old.id
RETURNING d.id;

-- name: webhook_secret_get
-- The webhook secret of a live key (by :key_id, or by :name when it is NULL), and its previous one while within :grace_seconds of a rotation.
SELECT k.id AS key_id, k.name AS key_name, k.webhook_secret AS secret,
       CASE WHEN k.webhook_secret_rotated_at > now() - make_interval(secs => CAST(:grace_seconds AS float8))
            THEN k.webhook_secret_previous END AS previous_secret,
       CASE WHEN k.webhook_secret_rotated_at > now() - make_interval(secs => CAST(:grace_seconds AS float8))
            THEN k.webhook_secret_rotated_at + make_interval(secs => CAST(:grace_seconds AS float8))
       END AS previous_valid_until,
       k.webhook_secret_rotated_at AS rotated_at
FROM api_keys k
WHERE k.revoked_at IS NULL
  AND (k.id = CAST(:key_id AS bigint)
       OR (CAST(:key_id AS bigint) IS NULL AND k.name = CAST(:name AS text)));

-- name: webhook_secret_rotate
-- Gives a live key (by :key_id, or by :name when it is NULL) the new webhook secret :secret, keeping the current one as the previous (it signs too for :grace_seconds), recording key.rotate_webhook_secret by :actor in audit_log; answers the key's secrets.
WITH rotated AS (
    UPDATE api_keys k
    SET webhook_secret_previous = k.webhook_secret,
        webhook_secret = CAST(:secret AS text),
        webhook_secret_rotated_at = now()
    WHERE k.revoked_at IS NULL
      AND (k.id = CAST(:key_id AS bigint)
           OR (CAST(:key_id AS bigint) IS NULL AND k.name = CAST(:name AS text)))
    RETURNING k.id AS key_id, k.name AS key_name, k.webhook_secret AS secret,
              k.webhook_secret_previous AS previous_secret,
              now() + make_interval(secs => CAST(:grace_seconds AS float8))
                  AS previous_valid_until,
              k.webhook_secret_rotated_at AS rotated_at
),
audited AS (
    INSERT INTO audit_log (actor, actor_key_id, action, outcome, key_name)
    SELECT CAST(:actor AS text), CAST(:actor_key_id AS bigint), 'key.rotate_webhook_secret',
           'changed', r.key_name
    FROM rotated r
)
SELECT * FROM rotated;
