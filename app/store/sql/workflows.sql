-- Named statements for composing work (migration 0021): workflows, the parents a job waits
-- for, and the rows of ordering keys. app/store/workflows.py (WorkflowStore) is the only caller.
-- What moves a waiting job is not here: the triggers in app/store/sql/schema/linked.sql do it in the transaction
-- of the parent's finish. These statements create the graph, read it, and cancel or retry it.

-- name: job_ids_reserve
-- Takes :n ids from the jobs' sequence, in order, for the steps of a workflow (their depends_on name each other).
SELECT nextval((SELECT CAST(pg_get_serial_sequence('jobs', 'id') AS regclass))) AS id
FROM generate_series(1, CAST(:n AS int));

-- name: job_parents_found
-- Of the given job ids, the jobs that exist, with their queue (to check the caller may see them).
SELECT j.id, j.queue
FROM jobs j
WHERE j.id = ANY (CAST(:ids AS bigint[]));

-- name: job_parent_outcomes
-- For each given (claimed) job, its parents in depends_on order: id, state, whether its queue is outside :queue_patterns (hidden: neither its step nor its result is read), whether it has a result and its size, and the result while it fits :inline_bytes and the results inline before it plus it fit :total_bytes.
-- :queue_patterns (SQL LIKE) are the claiming key's scopes; NULL: every queue. Only results
-- that can come inline (readable, at most :inline_bytes) count toward :total_bytes, so a small
-- result behind large ones still comes. Once one that could come does not fit, the ones after
-- it are not read here: the caller may still take those that fit what is left
-- (job_parent_results), for each result inline counts and none other does.
SELECT o.job_id, o.id,
       CASE WHEN o.hidden THEN NULL ELSE o.step END AS step,
       o.status, o.hidden, o.has_result, o.size,
       CASE WHEN o.fits AND o.running_size <= CAST(:total_bytes AS bigint)
            THEN o.result END AS result,
       o.fits AND o.running_size <= CAST(:total_bytes AS bigint) AS inline
FROM (
    SELECT v.*,
           sum(CASE WHEN v.fits THEN v.size ELSE 0 END)
               OVER (PARTITION BY v.job_id ORDER BY v.ord) AS running_size
    FROM (
        SELECT c.id AS job_id, d.ord, p.id, p.workflow_step AS step,
               COALESCE(p.status, 'deleted') AS status, p.result,
               p.id IS NOT NULL AND CAST(:queue_patterns AS text[]) IS NOT NULL
                   AND NOT p.queue LIKE ANY (CAST(:queue_patterns AS text[])) AS hidden,
               p.result IS NOT NULL AS has_result,
               COALESCE(octet_length(p.result::text), 0) AS size,
               p.result IS NOT NULL
                   AND (CAST(:queue_patterns AS text[]) IS NULL
                        OR p.queue LIKE ANY (CAST(:queue_patterns AS text[])))
                   AND octet_length(p.result::text) <= CAST(:inline_bytes AS int) AS fits
        FROM jobs c
        CROSS JOIN LATERAL unnest(c.depends_on) WITH ORDINALITY AS d(parent_id, ord)
        LEFT JOIN jobs p ON p.id = d.parent_id
        WHERE c.id = ANY (CAST(:ids AS bigint[]))
    ) v
) o
ORDER BY o.job_id, o.ord;

-- name: job_parent_results
-- The results of the given (finished) parent jobs, read by id: those job_parent_outcomes left out that still fit a claim's inline budget.
SELECT p.id, p.result
FROM jobs p
WHERE p.id = ANY (CAST(:ids AS bigint[]));

-- name: workflow_create
-- Records a workflow (its name, step count, who made it, its idempotency key and the request's fingerprint); its steps are enqueued next, in the same transaction. No row back when another workflow holds the key.
-- Of two creates with one key at once, the second's insert waits for the first's transaction
-- on the unique index (migration 0026) and then skips: its next statement (READ COMMITTED)
-- finds the first's workflow with workflow_get_by_idempotency_key.
INSERT INTO workflows (name, steps, created_by, created_by_key_id, idempotency_key,
                       idempotency_hash)
VALUES (CAST(:name AS text), CAST(:steps AS int), CAST(:actor AS text),
        CAST(:actor_key_id AS bigint), CAST(:idempotency_key AS text),
        CAST(:idempotency_hash AS text))
ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
RETURNING *;

-- name: workflow_get_by_idempotency_key
-- Reads the workflow holding an idempotency key.
SELECT * FROM workflows WHERE idempotency_key = CAST(:idempotency_key AS text);

-- name: workflow_get
-- Reads one workflow.
SELECT * FROM workflows WHERE id = :id;

-- name: workflow_steps
-- Reads a workflow's steps (its jobs) in the order they were created.
SELECT * FROM jobs WHERE workflow_id = :id ORDER BY id;

-- name: workflow_lock
-- Locks every step of a workflow in id order: a step finishing now is waited for, and the statement that follows (cancel or retry) sees it finished.
SELECT id FROM jobs WHERE workflow_id = :id ORDER BY id FOR NO KEY UPDATE;

-- name: workflow_cancel
-- Cancels every open step of a workflow (waiting, scheduled, pending; a running one's lease ends at once), recording each in job_events and the whole in audit_log; answers the steps it cancelled.
WITH target AS (
    SELECT * FROM jobs
    WHERE workflow_id = :id AND status IN ('waiting', 'scheduled', 'pending', 'running')
),
cancelled AS (
    UPDATE jobs j
    SET status = 'cancelled',
        finished_at = now(),
        lease_expires_at = NULL,
        lease_ended_by = CASE WHEN t.status = 'running' THEN 'cancel' ELSE j.lease_ended_by END,
        updated_at = now()
    FROM target t
    WHERE j.id = t.id AND j.status = t.status
    RETURNING j.id, j.queue, t.status AS status_before, t.started_at, t.attempts, t.worker_id,
              t.lease_key_id, t.lease_instance
),
events AS (
    INSERT INTO job_events (job_id, at, kind, attempt, actor, actor_key_id, instance, data)
    SELECT c.id, c.started_at, 'claimed', c.attempts, c.worker_id, c.lease_key_id,
           c.lease_instance, NULL
    FROM cancelled c WHERE c.status_before = 'running'
    UNION ALL
    SELECT c.id, now(), 'cancelled', NULL, CAST(:actor AS text), CAST(:actor_key_id AS bigint),
           NULL, jsonb_build_object('status_before', c.status_before, 'workflow_id', :id)
    FROM cancelled c
),
audited AS (
    INSERT INTO audit_log (actor, actor_key_id, action, outcome, detail)
    SELECT CAST(:actor AS text), CAST(:actor_key_id AS bigint), 'workflow.cancel', 'changed',
           jsonb_build_object('workflow_id', :id, 'cancelled', count(*))
    FROM cancelled
    HAVING count(*) > 0
)
SELECT id, queue, status_before FROM cancelled;

-- name: workflow_retry
-- Puts every dead or cancelled step of a workflow back, attempts reset: pending when all its parents succeeded, waiting otherwise (a retried parent's success then moves it); records each in job_events and the whole in audit_log; answers the steps it moved.
WITH target AS (
    SELECT * FROM jobs WHERE workflow_id = :id AND status IN ('dead', 'cancelled')
),
retried AS (
    UPDATE jobs j
    SET status = CASE WHEN EXISTS (SELECT 1 FROM jobs p
                                   WHERE p.id = ANY (j.depends_on) AND p.status <> 'succeeded')
                      THEN 'waiting' ELSE 'pending' END,
        attempts = 0, run_at = now(),
        lease_id = NULL, worker_id = NULL, lease_key_id = NULL, lease_instance = NULL,
        lease_ended_by = NULL, lease_expires_at = NULL, started_at = NULL, finished_at = NULL,
        result = NULL, updated_at = now()
    FROM target t
    WHERE j.id = t.id AND j.status = t.status
    RETURNING j.id, j.queue, j.status, t.status AS status_before
),
events AS (
    INSERT INTO job_events (job_id, kind, actor, actor_key_id, data)
    SELECT r.id, 'retried', CAST(:actor AS text), CAST(:actor_key_id AS bigint),
           jsonb_build_object('status_before', r.status_before, 'status', r.status,
                              'workflow_id', :id)
    FROM retried r
),
audited AS (
    INSERT INTO audit_log (actor, actor_key_id, action, outcome, detail)
    SELECT CAST(:actor AS text), CAST(:actor_key_id AS bigint), 'workflow.retry', 'changed',
           jsonb_build_object('workflow_id', :id, 'retried', count(*))
    FROM retried
    HAVING count(*) > 0
)
SELECT id, queue, status, status_before FROM retried;

-- name: workflow_prune
-- Deletes at most :batch_size workflows older than :older_than_seconds whose steps are all gone (pruned or deleted).
DELETE FROM workflows w
WHERE w.id IN (
    SELECT w2.id FROM workflows w2
    WHERE w2.created_at < COALESCE(CAST(:now AS timestamptz), now())
                          - make_interval(secs => CAST(:older_than_seconds AS float8))
      AND NOT EXISTS (SELECT 1 FROM jobs j WHERE j.workflow_id = w2.id)
    ORDER BY w2.created_at
    LIMIT :batch_size
    FOR UPDATE SKIP LOCKED
)
RETURNING w.id;

-- name: ordering_key_prune
-- Deletes at most :batch_size rows of ordering keys untouched for :older_than_seconds and with no open job (an enqueue of the key makes its row again).
DELETE FROM ordering_keys k
WHERE (k.queue, k.ordering_key) IN (
    SELECT k2.queue, k2.ordering_key FROM ordering_keys k2
    WHERE k2.updated_at < COALESCE(CAST(:now AS timestamptz), now())
                          - make_interval(secs => CAST(:older_than_seconds AS float8))
      AND NOT EXISTS (SELECT 1 FROM jobs j
                      WHERE j.queue = k2.queue AND j.ordering_key = k2.ordering_key
                        AND j.status IN ('waiting', 'scheduled', 'pending', 'running'))
    ORDER BY k2.updated_at
    LIMIT :batch_size
    FOR UPDATE SKIP LOCKED
)
RETURNING k.queue;

-- name: ordering_keys_lock
-- Takes the rows of the given (queue, ordering key) pairs in key order (made when missing), in the enqueue's transaction: enqueues of several keys then never wait for each other in opposite orders.
INSERT INTO ordering_keys AS k (queue, ordering_key)
SELECT DISTINCT q.queue, q.ordering_key
FROM jsonb_to_recordset(CAST(:keys AS jsonb)) AS q(queue text, ordering_key text)
ORDER BY q.queue, q.ordering_key
ON CONFLICT (queue, ordering_key) DO UPDATE SET updated_at = now();

-- name: ordering_key_unstick
-- For each given (queue, ordering key), or for the keys enqueued to in the last :recent_seconds when none are given, makes the oldest waiting job due when no job of the key is scheduled, pending or running; answers the jobs it moved.
-- A finish looks for the next job without the key's lock, so an enqueue committing at that
-- moment can leave its job waiting with nothing ahead; this catches it up (after each keyed
-- enqueue, and in the promoter's pass). Two of these, or one and a finish, pick the same
-- oldest job, and the row's re-check lets one move it.
WITH keys AS (
    SELECT q.queue, q.ordering_key
    FROM jsonb_to_recordset(CAST(:keys AS jsonb)) AS q(queue text, ordering_key text)
    WHERE CAST(:keys AS jsonb) IS NOT NULL
    UNION
    SELECT k.queue, k.ordering_key
    FROM ordering_keys k
    WHERE CAST(:keys AS jsonb) IS NULL
      AND k.updated_at > now() - make_interval(secs => CAST(:recent_seconds AS float8))
),
stuck AS (
    SELECT n.id
    FROM keys k
    CROSS JOIN LATERAL (
        SELECT w.id FROM jobs w
        WHERE w.queue = k.queue AND w.ordering_key = k.ordering_key AND w.status = 'waiting'
        ORDER BY w.id
        LIMIT 1
    ) n
    WHERE NOT EXISTS (SELECT 1 FROM jobs o
                      WHERE o.queue = k.queue AND o.ordering_key = k.ordering_key
                        AND o.status IN ('scheduled', 'pending', 'running'))
),
moved AS (
    UPDATE jobs j
    SET status = CASE WHEN j.run_at > now() THEN 'scheduled' ELSE 'pending' END,
        updated_at = now()
    FROM stuck s
    WHERE j.id = s.id AND j.status = 'waiting'
    RETURNING j.id, j.queue, j.status
),
events AS (
    INSERT INTO job_events (job_id, kind, data)
    SELECT id, 'ready', jsonb_build_object('status', status, 'caught_up', true) FROM moved
)
SELECT id, queue, status FROM moved;
