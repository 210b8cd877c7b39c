-- Named statements for producers: the API's enqueue (job_enqueue, its lean answer and the
-- lookup of the jobs a replay answers), and for producers that share jobq's database (migration
-- 0019) the bounds the function jobq.enqueue() they call inside their own transactions checks.
-- app/store/producers.py (ProducerStore) is the only caller.

-- name: enqueue_limits_set
-- Writes the bounds and defaults jobq.enqueue() applies (one row), as this instance's settings have them.
INSERT INTO jobq.enqueue_limits AS l (id, queue_name_max_chars, type_max_chars,
                                      idempotency_key_max_chars, concurrency_key_max_chars,
                                      payload_max_bytes, max_attempts_default,
                                      lease_seconds_default, json_max_depth, updated_at)
VALUES (true, :queue_name_max_chars, :type_max_chars, :idempotency_key_max_chars,
        :concurrency_key_max_chars, :payload_max_bytes, :max_attempts_default,
        :lease_seconds_default, :json_max_depth, now())
ON CONFLICT (id) DO UPDATE
SET queue_name_max_chars = EXCLUDED.queue_name_max_chars,
    type_max_chars = EXCLUDED.type_max_chars,
    idempotency_key_max_chars = EXCLUDED.idempotency_key_max_chars,
    concurrency_key_max_chars = EXCLUDED.concurrency_key_max_chars,
    payload_max_bytes = EXCLUDED.payload_max_bytes,
    max_attempts_default = EXCLUDED.max_attempts_default,
    lease_seconds_default = EXCLUDED.lease_seconds_default,
    json_max_depth = EXCLUDED.json_max_depth,
    updated_at = now()
WHERE (l.queue_name_max_chars, l.type_max_chars, l.idempotency_key_max_chars,
       l.concurrency_key_max_chars, l.payload_max_bytes, l.max_attempts_default,
       l.lease_seconds_default, l.json_max_depth)
      IS DISTINCT FROM
      (EXCLUDED.queue_name_max_chars, EXCLUDED.type_max_chars, EXCLUDED.idempotency_key_max_chars,
       EXCLUDED.concurrency_key_max_chars, EXCLUDED.payload_max_bytes,
       EXCLUDED.max_attempts_default, EXCLUDED.lease_seconds_default, EXCLUDED.json_max_depth);

-- fragment: job_enqueue_insert
-- The insert of job_enqueue, job_enqueue_ids and job_enqueue_plain, up to its conflict clause.
-- A job naming no callback_url takes its queue's default (migration 0020). The queue is looked
-- up only while some queue has a default: the EXISTS is uncorrelated, so it runs once per
-- statement (an InitPlan over the small queues table), and the per-item lookup under the CASE
-- runs only when it said yes. callback_key_id is kept only for a job that has a callback.
-- An item may leave out what its producer left out (a plain batch sends the request's own
-- fields, app/domain/types.py PlainJobs): queue and priority take the API's defaults, and
-- max_attempts, lease_seconds, traceparent and callback_key_id the call's (:max_attempts,
-- :lease_seconds, :traceparent, :callback_key_id; NULL where the items carry them).
WITH items AS MATERIALIZED (
    -- A workflow's steps come with ids reserved beforehand (job_ids_reserve), so that their
    -- depends_on can name each other.
    -- The sequence is named once (an InitPlan): called per item, pg_get_serial_sequence took
    -- a fifth of a 500-job insert.
    SELECT t.ord, t.item,
           COALESCE((t.item->>'id')::bigint,
                    nextval((SELECT CAST(pg_get_serial_sequence('jobs', 'id') AS regclass))))
               AS new_id,
           COALESCE((t.item->>'run_at')::timestamptz,
                    now() + make_interval(secs => COALESCE((t.item->>'delay_seconds')::float8, 0)))
               AS run_at,
           COALESCE(t.item->>'callback_url',
                    CASE WHEN (SELECT EXISTS (SELECT 1 FROM queues d WHERE d.callback_url IS NOT NULL))
                         THEN (SELECT q.callback_url FROM queues q
                               WHERE q.name = COALESCE(t.item->>'queue', 'default'))
                    END) AS callback_url
    FROM jsonb_array_elements(CAST(:items AS jsonb)) WITH ORDINALITY AS t(item, ord)
),
inserted AS (
    INSERT INTO jobs (id, queue, type, payload, priority, status, max_attempts, lease_seconds,
                      timeout_seconds, run_at, idempotency_key, idempotency_hash,
                      concurrency_key, traceparent, callback_url, callback_key_id,
                      depends_on, on_parent_failure, ordering_key, workflow_id, workflow_step,
                      has_dependents)
    OVERRIDING SYSTEM VALUE
    SELECT new_id,
           COALESCE(item->>'queue', 'default'),
           item->>'type',
           COALESCE(item->'payload', 'null'::jsonb),
           COALESCE((item->>'priority')::int, 0),
           CASE WHEN run_at > now() THEN 'scheduled' ELSE 'pending' END,
           COALESCE((item->>'max_attempts')::int, CAST(:max_attempts AS int)),
           COALESCE((item->>'lease_seconds')::int, CAST(:lease_seconds AS int)),
           (item->>'timeout_seconds')::int,
           run_at,
           item->>'idempotency_key',
           item->>'idempotency_hash',
           item->>'concurrency_key',
           COALESCE(item->>'traceparent', CAST(:traceparent AS text)),
           callback_url,
           CASE WHEN callback_url IS NOT NULL
                THEN COALESCE((item->>'callback_key_id')::bigint, CAST(:callback_key_id AS bigint))
           END,
           -- Jobs naming parents or an ordering key go through jobs_linked_inserted (migration
           -- 0021), which may make them waiting (or cancelled: a parent failed already).
           CASE WHEN jsonb_typeof(item->'depends_on') = 'array' THEN
               ARRAY(SELECT jsonb_array_elements_text(item->'depends_on')::bigint) END,
           item->>'on_parent_failure',
           item->>'ordering_key',
           (item->>'workflow_id')::bigint,
           item->>'workflow_step',
           COALESCE((item->>'has_dependents')::boolean, false)
    FROM items
    ORDER BY ord

-- name: job_enqueue
-- Inserts jobs in order (scheduled when run_at is ahead); an item whose (queue, idempotency_key) exists is skipped and answered with no job.
{{ job_enqueue_insert }}
    ON CONFLICT (queue, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING *
)
SELECT items.ord AS ord, inserted.*
FROM items LEFT JOIN inserted ON inserted.id = items.new_id
ORDER BY items.ord;

-- name: job_enqueue_ids
-- As job_enqueue, answering only each created job's id, queue, type and status (the lean batch answer): no wide row to return, decode and build.
{{ job_enqueue_insert }}
    ON CONFLICT (queue, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING id, queue, type, status
)
SELECT items.ord AS ord, inserted.id, inserted.queue, inserted.type, inserted.status
FROM items LEFT JOIN inserted ON inserted.id = items.new_id
ORDER BY items.ord;

-- name: job_enqueue_plain
-- As job_enqueue_ids for items without idempotency keys (PlainJobs): no ON CONFLICT, whose speculative insertion wrote one more WAL record per job (7 % of the statement).
{{ job_enqueue_insert }}
    RETURNING id, queue, type, status
)
SELECT items.ord AS ord, inserted.id, inserted.queue, inserted.type, inserted.status
FROM items JOIN inserted ON inserted.id = items.new_id
ORDER BY items.ord;

-- name: job_get_by_idempotency_keys
-- Reads the jobs holding the given (queue, idempotency_key) pairs.
SELECT j.*
FROM jsonb_to_recordset(CAST(:keys AS jsonb)) AS k(queue text, idempotency_key text)
JOIN jobs j ON j.queue = k.queue AND j.idempotency_key = k.idempotency_key;
