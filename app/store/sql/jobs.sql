-- Named statements for the jobs table. Each block starts with "-- name: <name>" and one line
-- saying what it does; app/store/statements.py loads them and app/store/jobs.py (JobStore) is
-- the only caller. Parameters are :name binds; jsonb arguments are passed as JSON text.
-- Every state change is one conditional statement: the rows it returns are the verdict.
-- Lease calls carry the worker id in each item, so concurrent requests of many workers can share
-- one statement (app/queue/coalesce.py) with the ownership check still made per item.
-- Per-queue counts are kept by triggers on jobs (app/store/sql/schema/counters.sql), not by these statements.
-- Statements of the maintenance loops take an optional :now (NULL: the database's now()), so
-- tests can run them exactly at a deadline.

-- The awaited-result statements (job_await_*): a row trigger (app/store/sql/schema/finished.sql) sends
-- pg_notify('jobq_finished', id) when a job whose awaited is true finishes or is deleted.

-- name: job_get
-- Reads one job by id.
SELECT * FROM jobs WHERE id = :id;

-- fragment: job_claim_lease
-- The lease both claims grant to the jobs of slotted (id, slot in claim order, best first, and
-- flow_keys), after the caller's own SET of flow_keys from m.flow_keys_of: a new attempt, a new
-- lease id for the slot's worker (worker_ids[slot]) and key (key_ids[slot]), its length
-- (lease_seconds[slot], NULL: the job's own) within the job's timeout, and the slot number
-- with the job as it is now.
status = 'running',
        attempts = j.attempts + 1,
        lease_id = gen_random_uuid(),
        worker_id = (CAST(:worker_ids AS text[]))[CAST(m.slot_of ->> CAST(j.id AS text) AS int)],
        lease_key_id = (CAST(:key_ids AS bigint[]))[CAST(m.slot_of ->> CAST(j.id AS text) AS int)],
        lease_instance = CAST(:instance AS text),
        lease_ended_by = NULL,
        lease_granted_seconds = COALESCE(
            (CAST(:lease_seconds AS int[]))[CAST(m.slot_of ->> CAST(j.id AS text) AS int)],
            j.lease_seconds),
        lease_expires_at = now() + make_interval(secs => LEAST(
            COALESCE(
                (CAST(:lease_seconds AS int[]))[CAST(m.slot_of ->> CAST(j.id AS text) AS int)],
                j.lease_seconds),
            COALESCE(j.timeout_seconds, 2147483647))),
        started_at = now(),
        updated_at = now()
    -- One row, and no join: the picked ids are probed through the primary key, and each row's
    -- slot is looked up by id in a jsonb object (a binary search). A generic plan cannot know
    -- how many jobs were picked; joined to them as rows, it either hashed a scan of the whole
    -- table (guessing hundreds) or, guessing one, probed every id once per picked job (seen:
    -- 1,275 probes for a claim of 50, with statistics taken while few jobs were pending).
    FROM (SELECT ARRAY(SELECT id FROM slotted) AS ids,
                 jsonb_object_agg(CAST(id AS text), slot) AS slot_of,
                 jsonb_object_agg(CAST(id AS text), flow_keys)
                     FILTER (WHERE flow_keys IS NOT NULL) AS flow_keys_of
          FROM slotted) m
    WHERE j.id = ANY (m.ids)
    RETURNING CAST(m.slot_of ->> CAST(j.id AS text) AS int) AS slot, j.*

-- fragment: job_claim_walk
-- job_claim's CTEs, from the queues named to claimed (the leased rows, slot first): shared with
-- job_complete_claim, which runs them after its completion in the same statement.
queue_names AS MATERIALIZED (
    SELECT DISTINCT q.name
    FROM unnest(CAST(:queues AS text[])) AS q(name)
    WHERE NOT EXISTS (SELECT 1 FROM queues p WHERE p.name = q.name AND p.paused)
      AND NOT EXISTS (SELECT 1 FROM flow_limits)
),
shares AS (
    SELECT name AS queue, CAST(:max_jobs AS int) AS take
    FROM queue_names
    WHERE (SELECT count(*) FROM queue_names) = 1
    UNION ALL
    SELECT best.queue, count(*)::int
    FROM (
        SELECT c.queue
        FROM queue_names qn
        CROSS JOIN LATERAL (
            -- Pending means due (scheduled jobs are another state), so this look needs no run_at
            -- bound; without one, only ix_jobs_claimable yields this order and it reads the head.
            -- The locking walk below still checks run_at, for rows older code may write.
            SELECT j.queue, j.priority, j.run_at, j.id
            FROM jobs j
            WHERE j.queue = qn.name AND j.status = 'pending'
            ORDER BY j.priority DESC, j.run_at, j.id
            LIMIT :max_jobs
        ) c
        ORDER BY c.priority DESC, c.run_at, c.id
        LIMIT :max_jobs
    ) best
    WHERE (SELECT count(*) FROM queue_names) > 1
    GROUP BY best.queue
),
picked AS MATERIALIZED (
    SELECT l.id, l.priority, l.run_at
    FROM shares s
    CROSS JOIN LATERAL (
        SELECT j.id, j.priority, j.run_at
        FROM jobs j
        WHERE j.queue = s.queue AND j.status = 'pending' AND j.run_at <= now()
        ORDER BY j.priority DESC, j.run_at, j.id
        LIMIT s.take
        FOR UPDATE SKIP LOCKED
    ) l
    -- The shares add up to at most :max_jobs; saying so lets the planner join by index.
    LIMIT :max_jobs
),
slotted AS (
    SELECT id, row_number() OVER (ORDER BY priority DESC, run_at, id) AS slot,
           CAST(NULL AS text[]) AS flow_keys
    FROM picked
),
claimed AS (
    UPDATE jobs j
    SET flow_keys = NULL,
        {{ job_claim_lease }}
)

-- name: job_claim
-- Leases up to :max_jobs due jobs from the given unpaused queues, best priority first, locking only the rows it takes, while no limit exists (else it takes nothing); slot k goes to worker_ids[k] of key_ids[k] with lease_seconds[k].
-- Each queue is walked in ix_jobs_claimable order (no sort of the backlog). With several queues,
-- an unlocked look at each queue's head first decides how many jobs each gives (its share of the
-- best :max_jobs); the locking walk then takes that many per queue, skipping rows others hold.
-- The jobs taken are numbered in claim order: slot k is leased to worker_ids[k] (of the API
-- key key_ids[k], NULL without keys) for lease_seconds[k] (NULL: the job's own), so several
-- concurrent claims share one statement.
-- While any limit exists (flow_limits) this statement takes nothing: claims then run
-- job_claim_limited below. This one stays as lean as it was before limits (measured: that one
-- costs about four times as much a call, most of it planning), and the service learns when
-- limits come and go from the jobq_limits channel, from job_claim_limited's report, and when
-- this statement answers nothing.
WITH {{ job_claim_walk }}
SELECT c.*, EXISTS (SELECT 1 FROM flow_limits) AS flow_active
FROM (SELECT 1) one LEFT JOIN claimed c ON true;

-- fragment: job_claim_limited_walk
-- job_claim_limited's CTEs, from the limits that block to claimed (the leased rows) and report
-- (what the statement says of the limits): shared with job_complete_claim_limited, which runs
-- them after its completion in the same statement.
blocked AS MATERIALIZED (
    -- Through two partial indexes that hold only such rows, however many keys there are.
    -- A full row with slots given back since (flow_released) is not full: the claim that locks
    -- it folds them.
    SELECT f.key, CAST(NULL AS float8) AS refill_seconds FROM flow_state f
    WHERE f.at_limit AND NOT EXISTS (SELECT 1 FROM flow_released r WHERE r.key = f.key)
    UNION ALL
    SELECT f.key, EXTRACT(EPOCH FROM f.blocked_until - now())::float8
    FROM flow_state f
    WHERE f.blocked_until > now()
),
queue_names AS MATERIALIZED (
    -- With the keys of each queue that are full or out of tokens (key rows are per queue:
    -- "key:<queue>|<concurrency_key>"), so both looks below pass over their jobs alike.
    SELECT q.name,
           ARRAY(SELECT substr(b.key, length(q.name) + 6) FROM blocked b
                 WHERE starts_with(b.key, 'key:' || q.name || '|')) AS full_keys
    FROM (SELECT DISTINCT name FROM unnest(CAST(:queues AS text[])) AS u(name)) q
    WHERE NOT EXISTS (SELECT 1 FROM queues p WHERE p.name = q.name AND p.paused)
      AND NOT EXISTS (SELECT 1 FROM blocked b WHERE b.key = 'queue:' || q.name)
),
shares AS (
    SELECT name AS queue, full_keys, CAST(:max_jobs AS int) AS take
    FROM queue_names
    WHERE (SELECT count(*) FROM queue_names) = 1
    UNION ALL
    SELECT best.queue, best.full_keys, count(*)::int
    FROM (
        SELECT c.queue, qn.full_keys
        FROM queue_names qn
        CROSS JOIN LATERAL (
            -- Pending means due (scheduled jobs are another state), so this look needs no run_at
            -- bound; without one, only ix_jobs_claimable yields this order and it reads the head.
            -- The locking walk below still checks run_at, for rows older code may write.
            SELECT j.queue, j.priority, j.run_at, j.id
            FROM jobs j
            WHERE j.queue = qn.name AND j.status = 'pending'
              AND (j.concurrency_key IS NULL OR j.concurrency_key <> ALL (qn.full_keys))
            ORDER BY j.priority DESC, j.run_at, j.id
            LIMIT :max_jobs
        ) c
        ORDER BY c.priority DESC, c.run_at, c.id
        LIMIT :max_jobs
    ) best
    WHERE (SELECT count(*) FROM queue_names) > 1
    GROUP BY best.queue, best.full_keys
),
picked AS MATERIALIZED (
    SELECT l.id, l.priority, l.run_at, l.queue, l.concurrency_key
    FROM shares s
    CROSS JOIN LATERAL (
        SELECT j.id, j.priority, j.run_at, j.queue, j.concurrency_key
        FROM jobs j
        WHERE j.queue = s.queue AND j.status = 'pending' AND j.run_at <= now()
          AND (j.concurrency_key IS NULL OR j.concurrency_key <> ALL (s.full_keys))
        ORDER BY j.priority DESC, j.run_at, j.id
        LIMIT s.take * CAST(:window AS int)
        FOR UPDATE SKIP LOCKED
    ) l
    -- The shares add up to at most :max_jobs; saying so lets the planner join by index.
    LIMIT CAST(:max_jobs AS int) * CAST(:window AS int)
),
key_limits AS MATERIALIZED (
    -- The limit of each key among the candidates (by the longest matching pattern), looked up
    -- once a key rather than once a candidate: a claim of hundreds of jobs has a few keys.
    SELECT c.queue, c.concurrency_key, m.key, m.max_running, m.rate_limit, m.rate_per_seconds
    FROM (SELECT DISTINCT queue, concurrency_key FROM picked
          WHERE concurrency_key IS NOT NULL) c
    CROSS JOIN LATERAL (
        SELECT 'key:' || c.queue || '|' || c.concurrency_key AS key, l.max_running,
               l.rate_limit, l.rate_per_seconds
        FROM flow_limits l
        WHERE l.scope = 'key' AND c.concurrency_key LIKE l.like_pattern
        ORDER BY length(l.pattern) DESC, l.id
        LIMIT 1
    ) m
),
queue_limits AS MATERIALIZED (
    -- Likewise each candidate queue's limit.
    SELECT c.queue, m.key, m.max_running, m.rate_limit, m.rate_per_seconds
    FROM (SELECT DISTINCT queue FROM picked) c
    CROSS JOIN LATERAL (
        SELECT 'queue:' || c.queue AS key, l.max_running, l.rate_limit, l.rate_per_seconds
        FROM flow_limits l
        WHERE l.scope = 'queue' AND c.queue LIKE l.like_pattern
        ORDER BY length(l.pattern) DESC, l.id
        LIMIT 1
    ) m
),
limits_needed AS MATERIALIZED (
    SELECT key, max_running, rate_limit, rate_per_seconds FROM key_limits
    UNION ALL
    SELECT key, max_running, rate_limit, rate_per_seconds FROM queue_limits
),
cand AS MATERIALIZED (
    -- One row a candidate with both its limited rows, its key's and its queue's (either may be
    -- NULL), and the rows whose running count it will hold (flow_keys, in key order: "key:"
    -- sorts before "queue:"). One flat row a candidate keeps every step below a scan of it
    -- joined to the few locked rows: a generic plan guessing one row a CTE cannot turn a join
    -- of candidates with candidates into a nested loop (seen: 1.4 s for 700 jobs).
    SELECT p.id, p.priority, p.run_at, k.key AS key_key, q.key AS queue_key,
           NULLIF(array_remove(ARRAY[CASE WHEN k.max_running IS NOT NULL THEN k.key END,
                                     CASE WHEN q.max_running IS NOT NULL THEN q.key END],
                               NULL), '{}') AS flow_keys
    FROM picked p
    LEFT JOIN key_limits k ON k.queue = p.queue AND k.concurrency_key = p.concurrency_key
    LEFT JOIN queue_limits q ON q.queue = p.queue
),
queue_rows AS MATERIALIZED (
    -- A queue's row is every claim's on that queue: wait for it (in key order) rather than skip.
    -- Locking yields the row's newest committed version, which may be newer than the one this
    -- statement's snapshot sees: everything below decides from these values, never from a read
    -- of flow_state in the snapshot (see flow_taken).
    SELECT f.key, f.running, f.tokens, f.refilled_at, f.max_running AS hint_max_running,
           f.rate_limit AS hint_rate_limit, f.rate_per_seconds AS hint_rate_per_seconds,
           f.blocked_until
    FROM flow_state f
    WHERE f.key IN (SELECT key FROM queue_limits)
    ORDER BY f.key
    FOR UPDATE
),
key_rows AS MATERIALIZED (
    -- Keys are many: a key another claim or release holds right now is skipped, not waited for,
    -- so claims on different keys never queue behind each other (the caller claims again when
    -- skipping left it empty-handed).
    SELECT f.key, f.running, f.tokens, f.refilled_at, f.max_running AS hint_max_running,
           f.rate_limit AS hint_rate_limit, f.rate_per_seconds AS hint_rate_per_seconds,
           f.blocked_until
    FROM flow_state f
    WHERE f.key IN (SELECT key FROM key_limits)
    ORDER BY f.key
    FOR UPDATE SKIP LOCKED
),
locked AS (
    SELECT * FROM queue_rows
    UNION ALL
    SELECT * FROM key_rows
),
released AS MATERIALIZED (
    -- Slots given back since the last fold (migration 0023), folded now that the rows are
    -- locked: exactly the journal rows this statement deletes (one another claim folded first
    -- is gone, not counted twice); releases not yet committed stay, counted as running.
    DELETE FROM flow_released r
    WHERE r.key IN (SELECT key FROM locked)
    RETURNING r.key, r.n
),
freed AS MATERIALIZED (
    SELECT key, sum(n)::int AS n FROM released GROUP BY key
),
room AS MATERIALIZED (
    -- What each locked row can give now: running slots left, tokens after the refill (the bucket
    -- holds at most rate_limit; a row new to its rate starts full). NULL: no such limit.
    SELECT f.key, lim.max_running, lim.rate_limit, lim.rate_per_seconds,
           f.running AS locked_running, COALESCE(fr.n, 0) AS freed, f.hint_max_running,
           f.hint_rate_limit, f.hint_rate_per_seconds, f.blocked_until,
           GREATEST(f.running - COALESCE(fr.n, 0), 0) AS running,
           lim.max_running - GREATEST(f.running - COALESCE(fr.n, 0), 0) AS slots,
           LEAST(lim.rate_limit::float8,
                 COALESCE(f.tokens, lim.rate_limit::float8)
                 + EXTRACT(EPOCH FROM now() - f.refilled_at)::float8
                   * lim.rate_limit / lim.rate_per_seconds) AS tokens
    FROM locked f
    JOIN limits_needed lim ON lim.key = f.key
    LEFT JOIN freed fr ON fr.key = f.key
),
judged AS MATERIALIZED (
    -- Each candidate with the room of its rows: all_locked, whether this claim holds every one
    -- of them; eligible, whether each has a slot and a whole token left at all.
    SELECT c.id, c.priority, c.run_at, c.key_key, c.queue_key, c.flow_keys,
           rk.slots AS key_slots, rk.tokens AS key_tokens,
           rq.slots AS queue_slots, rq.tokens AS queue_tokens,
           (c.key_key IS NULL OR rk.key IS NOT NULL)
               AND (c.queue_key IS NULL OR rq.key IS NOT NULL) AS all_locked,
           (c.key_key IS NULL OR rk.key IS NOT NULL)
               AND (c.queue_key IS NULL OR rq.key IS NOT NULL)
               AND NOT COALESCE(rk.slots < 1 OR rk.tokens < 1, false)
               AND NOT COALESCE(rq.slots < 1 OR rq.tokens < 1, false) AS eligible
    FROM cand c
    LEFT JOIN room rk ON rk.key = c.key_key
    LEFT JOIN room rq ON rq.key = c.queue_key
),
key_ok AS MATERIALIZED (
    -- The k-th best eligible candidate of a key needs k slots and k whole tokens there.
    -- Counting every eligible candidate can leave a slot unused (when a better one is refused by
    -- its queue), never overfill one.
    SELECT j.*
    FROM (SELECT j.*,
                 row_number() OVER (PARTITION BY j.key_key
                                    ORDER BY j.priority DESC, j.run_at, j.id) AS rn
          FROM judged j
          WHERE j.eligible) j
    WHERE j.key_key IS NULL
       OR NOT COALESCE(j.rn > j.key_slots OR j.rn > floor(j.key_tokens), false)
),
granted AS MATERIALIZED (
    -- Then each queue's limit, among the jobs their keys allow; the best :max_jobs of those.
    SELECT k.id, k.priority, k.run_at, k.key_key, k.queue_key, k.flow_keys
    FROM (SELECT k.*,
                 row_number() OVER (PARTITION BY k.queue_key
                                    ORDER BY k.priority DESC, k.run_at, k.id) AS qrn
          FROM key_ok k) k
    WHERE k.queue_key IS NULL
       OR NOT COALESCE(k.qrn > k.queue_slots OR k.qrn > floor(k.queue_tokens), false)
    ORDER BY k.priority DESC, k.run_at, k.id
    LIMIT :max_jobs
),
taken AS MATERIALIZED (
    SELECT t.key, count(*)::int AS n
    FROM (SELECT key_key AS key FROM granted WHERE key_key IS NOT NULL
          UNION ALL
          SELECT queue_key FROM granted WHERE queue_key IS NOT NULL) t
    GROUP BY t.key
),
flow_taken AS (
    -- Rows that granted jobs, and rows whose hints (the limit they repeat, blocked_until) were
    -- stale: a limit set again, or a bucket emptied without a grant. Writing the hints back is
    -- what lets the caller's next claim pass over a full key's jobs before it locks them.
    UPDATE flow_state f
    -- running is written here less the slots folded from the journal; the slots this claim
    -- takes are added by the trigger on jobs (migrations 0011, 0023) from the claimed rows'
    -- flow_keys, at the end of this statement, while it still holds these rows' locks.
    SET running = r.running,
        tokens = CASE WHEN r.rate_limit IS NULL THEN NULL ELSE r.tokens - r.n END,
        blocked_until = CASE WHEN r.tokens - r.n < 1 THEN
            now() + make_interval(secs => (1 - (r.tokens - r.n)) * r.rate_per_seconds
                                          / r.rate_limit) END,
        refilled_at = now(),
        max_running = r.max_running,
        rate_limit = r.rate_limit,
        rate_per_seconds = r.rate_per_seconds,
        updated_at = now()
    FROM (SELECT room.*, COALESCE(t.n, 0) AS n
          FROM room LEFT JOIN taken t ON t.key = room.key) r
    -- Which rows to write is decided from the locked values (room), not from f: f is the
    -- version this statement's snapshot sees, older than the locked one when another claim
    -- committed in between (a queue row waited for, or a key row whose claim committed between
    -- this statement's start and its lock). Judged from f, a row whose journal rows this
    -- statement deleted could look unchanged and be left unwritten: the slots they gave back
    -- were lost, and the key ran below its limit for good (seen under a two-instance stress).
    -- An update of a stale version is redone by PostgreSQL on the newest one, with these values.
    WHERE f.key = r.key
      AND (r.n > 0
           OR r.freed > 0
           OR r.locked_running <> r.running
           OR r.hint_max_running IS DISTINCT FROM r.max_running
           OR r.hint_rate_limit IS DISTINCT FROM r.rate_limit
           OR r.hint_rate_per_seconds IS DISTINCT FROM r.rate_per_seconds
           OR (r.tokens < 1 AND r.blocked_until IS NULL))
),
slotted AS (
    SELECT id, row_number() OVER (ORDER BY priority DESC, run_at, id) AS slot, flow_keys
    FROM granted
),
claimed AS (
    UPDATE jobs j
    -- A job without limited rows has none in m.flow_keys_of: NULL, as job_claim leaves it.
    SET flow_keys = NULLIF(ARRAY(SELECT jsonb_array_elements_text(
                                         m.flow_keys_of -> CAST(j.id AS text))), '{}'),
        {{ job_claim_lease }}
),
report AS (
    SELECT (SELECT array_agg(n.key) FROM limits_needed n
            WHERE NOT EXISTS (SELECT 1 FROM locked f WHERE f.key = n.key)
              AND NOT EXISTS (SELECT 1 FROM flow_state f WHERE f.key = n.key)) AS flow_missing,
           (SELECT array_agg(n.key) FROM limits_needed n
            WHERE NOT EXISTS (SELECT 1 FROM locked f WHERE f.key = n.key)
              AND EXISTS (SELECT 1 FROM flow_state f WHERE f.key = n.key)) AS flow_skipped,
           -- Candidates a limit refused (all their rows locked): their rows now say so, so a
           -- claim again passes over them to the next eligible jobs.
           ((SELECT count(*) FROM judged
             WHERE all_locked AND (key_key IS NOT NULL OR queue_key IS NOT NULL))
            - (SELECT count(*) FROM granted
               WHERE key_key IS NOT NULL OR queue_key IS NOT NULL))::int AS flow_refused,
           (SELECT min(s) FROM (
                -- Empty buckets this claim met: its queues', those of keys with pending jobs in
                -- its queues (skipped by the walk), and those it locked.
                SELECT b.refill_seconds AS s FROM blocked b
                WHERE b.refill_seconds > 0
                  AND (b.key IN (SELECT 'queue:' || q FROM unnest(CAST(:queues AS text[])) AS q)
                       -- A probe of ix_jobs_pending_concurrency_key per empty key (LIMIT 1
                       -- keeps the planner from hashing every pending job instead).
                       OR (starts_with(b.key, 'key:')
                           AND split_part(substr(b.key, 5), '|', 1) = ANY (CAST(:queues AS text[]))
                           AND (SELECT 1 FROM jobs j
                                WHERE j.concurrency_key = substr(b.key, strpos(b.key, '|') + 1)
                                  AND j.queue = split_part(substr(b.key, 5), '|', 1)
                                  AND j.status = 'pending'
                                LIMIT 1) IS NOT NULL))
                UNION ALL
                SELECT (1 - r.tokens) * r.rate_per_seconds / r.rate_limit FROM room r
                WHERE r.tokens < 1) w) AS flow_refill_seconds,
           EXISTS (SELECT 1 FROM flow_limits) AS flow_active
)

-- name: job_claim_limited
-- Leases up to :max_jobs due jobs from the given unpaused queues, best priority first, within their concurrency and rate limits, locking only the rows it takes; slot k goes to worker_ids[k] of key_ids[k] with lease_seconds[k].
-- The walk is job_claim's (the head look that shares :max_jobs among the queues, then the
-- locking walk of each queue in ix_jobs_claimable order), reading :window candidates per slot
-- and passing over the keys and queues marked full; the slots and the lease are its fragments.
--
-- Limits (flow_limits) are enforced here, in the same statement: each candidate's limited rows
-- in flow_state (its key's in its queue, "key:<queue>|<concurrency_key>", and its queue's,
-- "queue:<name>") are locked FOR UPDATE in key order, which yields their
-- newest committed version (a key's row held by another transaction is skipped, SKIP LOCKED,
-- and its jobs with it); a job is taken only while every one of its rows has a running slot
-- and a whole token left, counting the better candidates first; the rows are written back with
-- what was taken. A job over a limit is skipped, not failed, and the walk reads :window times
-- its share so that the next eligible jobs can stand in. Keys and queues whose row already says
-- "full" are skipped before anything is locked, by the share look and the walk alike (a hint
-- from the snapshot; the lock decides). A locked row whose hint was stale (a limit set again,
-- a row created empty) gets it written back, so whatever the hints said, the caller's next
-- statement passes over the jobs refused here.
-- The last row may carry no job (slot NULL): it reports flow_missing, limited rows that do not
-- exist yet (the caller creates them and claims again), flow_skipped, the keys whose rows were
-- held by others (the caller claims again, waiting for them), flow_refused, how many candidates a limit refused (for both the caller claims
-- its empty slots again), flow_refill_seconds, when the first
-- empty bucket gets a token back, and flow_active, whether any limit exists.
WITH {{ job_claim_limited_walk }}
SELECT c.*, r.flow_missing, r.flow_skipped, r.flow_refused, r.flow_refill_seconds,
       r.flow_active
FROM report r LEFT JOIN claimed c ON true;

-- fragment: job_event_claim
-- The claim of the attempt a transition ends, as a job_events VALUES row (at, kind, data) from
-- the transition's returned row f: its columns still hold the attempt's start.
f.started_at, 'claimed', NULL::jsonb

-- fragment: job_event_last_run
-- The events a job's columns tell of its last run (its claim, and its completion), as rows of
-- job_events for the job t, leaving out those recorded already: written before an operator's
-- retry clears the columns. GET /v1/jobs/{id}/events reads the same events from the columns
-- while they hold them (sql/job_events.sql).
SELECT t.id AS job_id, t.started_at AS at, 'claimed' AS kind, t.attempts AS attempt,
           t.worker_id AS actor, t.lease_key_id AS actor_key_id, t.lease_instance AS instance,
           NULL::jsonb AS data
    WHERE t.started_at IS NOT NULL
      AND NOT EXISTS (SELECT 1 FROM job_events s
                      WHERE s.job_id = t.id AND s.kind = 'claimed' AND s.at = t.started_at)
    UNION ALL
    SELECT t.id, t.finished_at, 'completed', t.attempts, t.worker_id, t.lease_key_id,
           t.lease_instance, NULL::jsonb
    WHERE t.status = 'succeeded' AND t.finished_at IS NOT NULL
      AND NOT EXISTS (SELECT 1 FROM job_events s
                      WHERE s.job_id = t.id AND s.kind = 'completed' AND s.at = t.finished_at)

-- fragment: job_lease_owned
-- The ownership check of every lease call's UPDATE (heartbeat, complete, fail, release): the row
-- j is the running attempt of item i's lease, held by its worker under its key, and not past its
-- timeout.
j.id = i.job_id AND j.lease_id = i.lease_id
    AND j.status = 'running' AND j.worker_id = i.worker_id
    AND j.lease_key_id IS NOT DISTINCT FROM i.key_id
    AND (j.timeout_seconds IS NULL
         OR now() < j.started_at + make_interval(secs => j.timeout_seconds))

-- name: job_heartbeat
-- Extends the leases the worker still holds, saving checkpoint and progress in the same ownership-checked update; a progress that passes a tenth of its total is recorded in job_events; answers only the items it took.
WITH items AS MATERIALIZED (
    SELECT t.ord,
           (t.item->>'job_id')::bigint AS job_id,
           (t.item->>'lease_id')::uuid AS lease_id,
           t.item->>'worker_id' AS worker_id,
           (t.item->>'key_id')::bigint AS key_id,
           (t.item->>'lease_seconds')::int AS lease_seconds,
           t.item ? 'checkpoint' AS has_checkpoint,
           NULLIF(t.item->'checkpoint', 'null'::jsonb) AS checkpoint,
           t.item ? 'progress' AS has_progress,
           NULLIF(t.item->'progress', 'null'::jsonb) AS progress
    FROM jsonb_array_elements(CAST(:items AS jsonb)) WITH ORDINALITY AS t(item, ord)
),
-- The progress before this heartbeat, for the items that carry one: the update's RETURNING
-- sees only the new row. Read in the statement's snapshot, which the update re-checks.
before AS MATERIALIZED (
    SELECT j.id, jobq_progress_decile(j.progress) AS decile
    FROM items i JOIN jobs j ON j.id = i.job_id
    -- The ids as an array too, probed through the primary key: the generic plan the hot pool
    -- keeps (app/db.py) cannot count the items, and guessing a hundred it would hash a scan
    -- of a small table.
    WHERE j.id = ANY (ARRAY(SELECT job_id FROM items WHERE has_progress))
      AND i.has_progress AND jobq_progress_decile(i.progress) IS NOT NULL
),
beaten AS (
    UPDATE jobs j
    -- Never past the attempt's maximum run time: a stuck worker cannot heartbeat forever.
    SET lease_expires_at = LEAST(
            now() + make_interval(secs => COALESCE(i.lease_seconds, j.lease_granted_seconds,
                                                   j.lease_seconds)),
            j.started_at + make_interval(secs => j.timeout_seconds)),
        checkpoint = CASE WHEN i.has_checkpoint THEN i.checkpoint ELSE j.checkpoint END,
        checkpoint_at = CASE WHEN i.has_checkpoint THEN now() ELSE j.checkpoint_at END,
        progress = CASE WHEN i.has_progress THEN i.progress ELSE j.progress END,
        -- Moved: a progress or a checkpoint other than the stored one (not a mere heartbeat).
        progress_at = CASE WHEN (i.has_progress AND i.progress IS DISTINCT FROM j.progress)
                                OR (i.has_checkpoint AND i.checkpoint IS DISTINCT FROM j.checkpoint)
                           THEN now() ELSE j.progress_at END,
        updated_at = now()
    FROM items i
    WHERE {{ job_lease_owned }}
    RETURNING i.ord, j.id AS job_id, j.status, j.lease_expires_at, j.progress, j.attempts,
              j.worker_id, j.lease_key_id, j.lease_instance, i.has_checkpoint
),
events AS (
    -- Milestones only (at most ten a climb), not every heartbeat.
    INSERT INTO job_events (job_id, kind, attempt, actor, actor_key_id, instance, data)
    SELECT u.job_id, 'progress', u.attempts, u.worker_id, u.lease_key_id, u.lease_instance,
           jsonb_build_object('progress', u.progress, 'checkpoint_saved', u.has_checkpoint)
    FROM beaten u JOIN before b ON b.id = u.job_id
    WHERE jobq_progress_decile(u.progress) > COALESCE(b.decile, 0)
)
SELECT ord, job_id, status, lease_expires_at FROM beaten;

-- fragment: job_complete_items
-- The items of a complete (one per lease, in request order).
items AS MATERIALIZED (
    SELECT t.ord,
           (t.item->>'job_id')::bigint AS job_id,
           (t.item->>'lease_id')::uuid AS lease_id,
           t.item->>'worker_id' AS worker_id,
           (t.item->>'key_id')::bigint AS key_id,
           NULLIF(t.item->'result', 'null'::jsonb) AS result
    FROM jsonb_array_elements(CAST(:items AS jsonb)) WITH ORDINALITY AS t(item, ord)
)

-- fragment: job_complete_update
-- The UPDATE of job_complete over items, answering the items it took.
UPDATE jobs j
SET status = 'succeeded',
    result = i.result,
    finished_at = now(),
    lease_expires_at = NULL,
    lease_ended_by = 'complete',
    updated_at = now()
FROM items i
WHERE {{ job_lease_owned }}
RETURNING i.ord, j.id AS job_id, j.status, j.run_at, j.queue, j.type,
          EXTRACT(EPOCH FROM now() - j.started_at)::float8 AS ran_seconds,
          j.flow_keys IS NOT NULL AS freed_flow

-- fragment: job_settle_claim_answer
-- What a settle-and-claim statement answers while no limit exists: job_claim's rows, each with
-- the transition's answers (settled: ord, job_id, status, run_at, queue, type, ran_seconds,
-- freed_flow of the rows its UPDATE took, as JSON).
SELECT c.*, EXISTS (SELECT 1 FROM flow_limits) AS flow_active,
       -- Once, on the first slot's row (or the one row when nothing was claimed): repeated on
       -- every row, a claim of 50 sent and decoded the completion's 50 answers 50 times.
       CASE WHEN c.slot IS NULL OR c.slot = 1
            THEN (SELECT jsonb_agg(to_jsonb(s))
                  FROM (SELECT ord, job_id, status, run_at, queue, type, ran_seconds, freed_flow
                        FROM settled) s) END AS settled
FROM (SELECT 1) one LEFT JOIN claimed c ON true;

-- fragment: job_settle_claim_limited_answer
-- The same under limits: job_claim_limited's rows and report, each with the transition's answers.
SELECT c.*, r.flow_missing, r.flow_skipped, r.flow_refused, r.flow_refill_seconds,
       r.flow_active,
       CASE WHEN c.slot IS NULL OR c.slot = 1
            THEN (SELECT jsonb_agg(to_jsonb(s))
                  FROM (SELECT ord, job_id, status, run_at, queue, type, ran_seconds, freed_flow
                        FROM settled) s) END AS settled
FROM report r LEFT JOIN claimed c ON true;

-- name: job_complete
-- Marks held jobs succeeded with their result, unless the attempt ran past its timeout; answers only the items it took.
WITH {{ job_complete_items }}
{{ job_complete_update }};

-- name: job_complete_claim
-- job_complete, then job_claim for the worker in the same statement (one round trip, one commit); answers the claimed rows as job_claim does, each with the completion's answers (settled: its rows as JSON).
-- For a settle-and-claim call (app/queue/chained.py) while no limit exists. Both UPDATEs share a
-- snapshot: the claim cannot see the completion, which only takes running jobs it owns, and the
-- jobs it claims are pending. A limit freed by the completion is not the claim's to use, so
-- while any limit exists the claim takes nothing (as job_claim) and the caller claims again.
WITH {{ job_complete_items }},
settled AS (
    {{ job_complete_update }}
),
{{ job_claim_walk }}
{{ job_settle_claim_answer }}

-- name: job_complete_claim_limited
-- job_complete, then job_claim_limited for the workers in the same statement (one round trip, one commit); answers the claimed rows and the report as job_claim_limited does, each with the completion's answers (settled: its rows as JSON).
-- For settle-and-claim calls (app/queue/chained.py) while limits exist. The claim's snapshot is
-- the completion's: the slots the completion frees (flow_released, written by the flow trigger
-- at the statement's end) are not this claim's to use, so under a limit that binds it may take
-- fewer jobs than a claim after the commit would, and report the candidates it refused
-- (flow_refused): the caller then claims again, as after job_claim_limited.
WITH {{ job_complete_items }},
settled AS (
    {{ job_complete_update }}
),
{{ job_claim_limited_walk }}
{{ job_settle_claim_limited_answer }}

-- fragment: job_fail_items
-- The items of a fail (one per lease, in request order).
items AS MATERIALIZED (
    SELECT t.ord,
           (t.item->>'job_id')::bigint AS job_id,
           (t.item->>'lease_id')::uuid AS lease_id,
           t.item->>'worker_id' AS worker_id,
           (t.item->>'key_id')::bigint AS key_id,
           left(COALESCE(t.item->>'error', ''), CAST(:error_max_chars AS int)) AS error,
           t.item->>'error_type' AS error_type,
           -- A traceback keeps its end: the exception line is its last.
           right(t.item->>'traceback', CAST(:traceback_max_chars AS int)) AS traceback,
           t.item->>'fingerprint' AS fingerprint,
           COALESCE((t.item->>'retryable')::boolean, true) AS retryable,
           (t.item->>'retry_after_seconds')::float8 AS retry_after_seconds,
           t.item ? 'checkpoint' AS has_checkpoint,
           NULLIF(t.item->'checkpoint', 'null'::jsonb) AS checkpoint
    FROM jsonb_array_elements(CAST(:items AS jsonb)) WITH ORDINALITY AS t(item, ord)
)

-- fragment: job_fail_update
-- The UPDATE of job_fail over items, answering the items it took.
UPDATE jobs j
SET status = CASE WHEN NOT (i.retryable AND j.attempts < j.max_attempts) THEN 'dead'
                  WHEN i.retry_after_seconds = 0 THEN 'pending'
                  ELSE 'scheduled' END,
    run_at = CASE WHEN i.retryable AND j.attempts < j.max_attempts
                  THEN now() + COALESCE(make_interval(secs => i.retry_after_seconds),
                                        jobq_backoff(j.attempts, CAST(:backoff_base AS float8),
                                                     CAST(:backoff_cap AS float8)))
                  ELSE j.run_at END,
    finished_at = CASE WHEN i.retryable AND j.attempts < j.max_attempts
                       THEN NULL ELSE now() END,
    last_error = CASE WHEN i.error_type IS NULL THEN i.error
                      ELSE i.error_type || ': ' || i.error END,
    errors = jobq_errors_append(
        j.errors,
        jsonb_strip_nulls(jsonb_build_object(
            'attempt', j.attempts, 'at', now(), 'error', i.error, 'type', i.error_type,
            'worker_id', j.worker_id, 'kind', 'failed')),
        CAST(:errors_kept AS int)),
    checkpoint = CASE WHEN i.has_checkpoint THEN i.checkpoint ELSE j.checkpoint END,
    checkpoint_at = CASE WHEN i.has_checkpoint THEN now() ELSE j.checkpoint_at END,
    lease_expires_at = NULL,
    lease_ended_by = 'fail',
    updated_at = now()
FROM items i
WHERE {{ job_lease_owned }}
-- ran_seconds from now(), not finished_at: a retried attempt has no finished_at.
RETURNING i.ord, j.id AS job_id, j.status, j.run_at, j.queue, j.type,
          EXTRACT(EPOCH FROM now() - j.started_at)::float8 AS ran_seconds,
          j.flow_keys IS NOT NULL AS freed_flow,
          j.started_at, j.attempts, j.worker_id, j.lease_key_id, j.lease_instance,
          i.error, i.error_type, i.traceback, i.fingerprint, i.retryable, i.has_checkpoint

-- fragment: job_fail_events
-- job_fail's events, from the rows its UPDATE (settled) took: the attempt's claim and the failure.
events AS (
    INSERT INTO job_events (job_id, at, kind, attempt, actor, actor_key_id, instance, data)
    SELECT f.job_id, e.at, e.kind, f.attempts, f.worker_id, f.lease_key_id, f.lease_instance,
           e.data
    FROM settled f
    CROSS JOIN LATERAL (VALUES
        ({{ job_event_claim }}),
        (now(), 'failed', jsonb_strip_nulls(jsonb_build_object(
            'error', f.error, 'type', f.error_type, 'traceback', f.traceback,
            'fingerprint', f.fingerprint,
            'retryable', f.retryable, 'checkpoint_saved', f.has_checkpoint,
            'status', f.status,
            'run_at', CASE WHEN f.status <> 'dead' THEN f.run_at END)))
    ) AS e(at, kind, data)
)

-- name: job_fail
-- Records a failed attempt of held jobs: scheduled after a backoff (pending when retry_after_seconds is 0), or dead when not retryable or out of attempts; the attempt's claim and the failure go to job_events.
WITH {{ job_fail_items }},
settled AS (
    {{ job_fail_update }}
),
{{ job_fail_events }}
SELECT ord, job_id, status, run_at, queue, type, ran_seconds, freed_flow FROM settled;

-- name: job_fail_claim
-- job_fail, then job_claim for the worker in the same statement (one round trip, one commit); answers the claimed rows as job_claim does, each with the failure's answers (settled: its rows as JSON).
-- As job_complete_claim. A job the failure makes pending again (retry_after_seconds 0) is not
-- this claim's to see (one snapshot): the caller claims again when its claim came back short.
WITH {{ job_fail_items }},
settled AS (
    {{ job_fail_update }}
),
{{ job_fail_events }},
{{ job_claim_walk }}
{{ job_settle_claim_answer }}

-- name: job_fail_claim_limited
-- job_fail, then job_claim_limited for the workers in the same statement (one round trip, one commit); answers the claimed rows and the report as job_claim_limited does, each with the failure's answers (settled: its rows as JSON).
-- As job_complete_claim_limited.
WITH {{ job_fail_items }},
settled AS (
    {{ job_fail_update }}
),
{{ job_fail_events }},
{{ job_claim_limited_walk }}
{{ job_settle_claim_limited_answer }}

-- fragment: job_release_items
-- The items of a release (one per lease, in request order).
items AS MATERIALIZED (
    SELECT t.ord,
           (t.item->>'job_id')::bigint AS job_id,
           (t.item->>'lease_id')::uuid AS lease_id,
           t.item->>'worker_id' AS worker_id,
           (t.item->>'key_id')::bigint AS key_id,
           COALESCE((t.item->>'delay_seconds')::float8, 0) AS delay_seconds,
           t.item ? 'checkpoint' AS has_checkpoint,
           NULLIF(t.item->'checkpoint', 'null'::jsonb) AS checkpoint
    FROM jsonb_array_elements(CAST(:items AS jsonb)) WITH ORDINALITY AS t(item, ord)
)

-- fragment: job_release_update
-- The UPDATE of job_release over items, answering the items it took.
UPDATE jobs j
SET status = CASE WHEN i.delay_seconds > 0 THEN 'scheduled' ELSE 'pending' END,
    attempts = GREATEST(j.attempts - 1, 0),
    run_at = now() + make_interval(secs => i.delay_seconds),
    checkpoint = CASE WHEN i.has_checkpoint THEN i.checkpoint ELSE j.checkpoint END,
    checkpoint_at = CASE WHEN i.has_checkpoint THEN now() ELSE j.checkpoint_at END,
    lease_expires_at = NULL,
    lease_ended_by = 'release',
    updated_at = now()
FROM items i
-- A worker cannot dodge its timeout by releasing: the overrun attempt counts as failed.
WHERE {{ job_lease_owned }}
-- The attempt the worker ran is the one before the release gave it back.
RETURNING i.ord, j.id AS job_id, j.status, j.run_at, j.queue, j.type,
          NULL::float8 AS ran_seconds, j.flow_keys IS NOT NULL AS freed_flow,
          j.started_at, j.attempts + 1 AS attempts, j.worker_id, j.lease_key_id,
          j.lease_instance, i.delay_seconds, i.has_checkpoint

-- fragment: job_release_events
-- job_release's events, from the rows its UPDATE (settled) took: the attempt's claim and the release.
events AS (
    INSERT INTO job_events (job_id, at, kind, attempt, actor, actor_key_id, instance, data)
    SELECT f.job_id, e.at, e.kind, f.attempts, f.worker_id, f.lease_key_id, f.lease_instance,
           e.data
    FROM settled f
    CROSS JOIN LATERAL (VALUES
        ({{ job_event_claim }}),
        (now(), 'released', jsonb_build_object(
            'checkpoint_saved', f.has_checkpoint, 'delay_seconds', f.delay_seconds,
            'status', f.status, 'run_at', f.run_at))
    ) AS e(at, kind, data)
)

-- name: job_release
-- Returns held jobs to pending (scheduled after a delay) without charging the attempt, keeping or replacing the checkpoint; the attempt's claim and the release go to job_events.
WITH {{ job_release_items }},
settled AS (
    {{ job_release_update }}
),
{{ job_release_events }}
SELECT ord, job_id, status, run_at, queue, type, freed_flow FROM settled;

-- name: job_release_claim
-- job_release, then job_claim for the worker in the same statement (one round trip, one commit); answers the claimed rows as job_claim does, each with the release's answers (settled: its rows as JSON).
-- As job_fail_claim: the jobs released are not this claim's to see (one snapshot).
WITH {{ job_release_items }},
settled AS (
    {{ job_release_update }}
),
{{ job_release_events }},
{{ job_claim_walk }}
{{ job_settle_claim_answer }}

-- name: job_release_claim_limited
-- job_release, then job_claim_limited for the workers in the same statement (one round trip, one commit); answers the claimed rows and the report as job_claim_limited does, each with the release's answers (settled: its rows as JSON).
-- As job_complete_claim_limited. The limited walk has a CTE of its own named released.
WITH {{ job_release_items }},
settled AS (
    {{ job_release_update }}
),
{{ job_release_events }},
{{ job_claim_limited_walk }}
{{ job_settle_claim_limited_answer }}

-- name: job_lease_verdict
-- For lease items a transition did not take, read after it: a replay of that same transition (answered with the job's state now), or lost; and whether this lease was cancelled or timed out.
-- Runs as its own statement so it sees what the transition saw when it re-checked the row:
-- a fallback inside the transition's statement would read that statement's older snapshot.
WITH items AS MATERIALIZED (
    SELECT t.ord,
           (t.item->>'job_id')::bigint AS job_id,
           (t.item->>'lease_id')::uuid AS lease_id,
           t.item->>'worker_id' AS worker_id,
           (t.item->>'key_id')::bigint AS key_id
    FROM jsonb_array_elements(CAST(:items AS jsonb)) WITH ORDINALITY AS t(item, ord)
)
SELECT i.ord, i.job_id,
       CASE WHEN mine AND j.lease_ended_by = CAST(:transition AS text) THEN j.status END AS status,
       j.run_at,
       j.lease_expires_at,
       COALESCE(mine AND j.lease_ended_by = 'cancel', false) AS cancelled,
       COALESCE(mine AND (j.lease_ended_by = 'timeout'
                          OR (j.status = 'running' AND j.lease_ended_by IS NULL
                              AND now() >= j.started_at + make_interval(secs => j.timeout_seconds))),
                false) AS timed_out
FROM items i
LEFT JOIN jobs j ON j.id = i.job_id
CROSS JOIN LATERAL (SELECT j.lease_id = i.lease_id AND j.worker_id = i.worker_id
                           AND j.lease_key_id IS NOT DISTINCT FROM i.key_id AS mine) m
ORDER BY i.ord;

-- name: job_cancel
-- Cancels a pending, scheduled or running job (a running job's lease ends at once), recording it in job_events with its actor; answers the job as it is now, its status before and whether this call changed it.
-- The row is locked first, so the verdict and the answer describe the same, newest version even
-- when another transition commits while this one waits for the row.
WITH target AS (
    SELECT * FROM jobs WHERE id = :id FOR UPDATE
),
cancelled AS (
    UPDATE jobs j
    SET status = 'cancelled',
        finished_at = now(),
        lease_expires_at = NULL,
        lease_ended_by = CASE WHEN t.status = 'running' THEN 'cancel' ELSE j.lease_ended_by END,
        updated_at = now()
    FROM target t
    WHERE j.id = t.id AND t.status IN ('pending', 'scheduled', 'running', 'waiting')
    RETURNING j.*
),
events AS (
    -- A running job's attempt ends here: its claim is recorded with the cancel.
    INSERT INTO job_events (job_id, at, kind, attempt, actor, actor_key_id, instance, data)
    SELECT t.id, t.started_at, 'claimed', t.attempts, t.worker_id, t.lease_key_id,
           t.lease_instance, NULL
    FROM target t JOIN cancelled c ON c.id = t.id
    WHERE t.status = 'running'
    UNION ALL
    SELECT t.id, now(), 'cancelled', NULL, CAST(:actor AS text), CAST(:actor_key_id AS bigint),
           NULL, jsonb_build_object('status_before', t.status)
    FROM target t JOIN cancelled c ON c.id = t.id
)
-- status_before: the state the decision saw, for the audit row the service writes next.
SELECT true AS changed, target.status AS status_before, cancelled.* FROM cancelled, target
UNION ALL
SELECT false AS changed, target.status AS status_before, target.*
FROM target WHERE NOT EXISTS (SELECT 1 FROM cancelled);

-- name: job_retry
-- Puts a dead, cancelled or succeeded job back to pending with its attempts reset (its checkpoint is kept), or to waiting while one of its parents is still open; records it in audit_log and job_events; answers the job as it is now and whether this call changed it.
WITH target AS (
    SELECT * FROM jobs WHERE id = :id FOR UPDATE
),
-- Its parents, locked: a parent finishing now is waited for and seen finished (a locked row is
-- read as its newest version), or it finishes after this commits and its trigger finds this job
-- waiting. Either way the job does not wait for a parent that has already ended.
parents_open AS (
    SELECT count(*) AS n
    FROM (SELECT p.status FROM jobs p
          WHERE p.id IN (SELECT unnest(t.depends_on) FROM target t)
          ORDER BY p.id
          FOR NO KEY UPDATE) p
    WHERE p.status IN ('waiting', 'scheduled', 'pending', 'running')
),
retried AS (
    UPDATE jobs j
    SET status = CASE WHEN (SELECT n FROM parents_open) > 0 THEN 'waiting' ELSE 'pending' END,
        attempts = 0, run_at = now(),
        lease_id = NULL, worker_id = NULL, lease_key_id = NULL, lease_instance = NULL,
        lease_ended_by = NULL, lease_expires_at = NULL, started_at = NULL, finished_at = NULL,
        result = NULL, updated_at = now()
    FROM target t
    WHERE j.id = t.id AND t.status IN ('dead', 'cancelled', 'succeeded')
    RETURNING j.*
),
audited AS (
    -- Only a change: a job that cannot be retried is refused (409) and writes nothing.
    INSERT INTO audit_log (actor, actor_key_id, action, outcome, queue, job_id,
                           state_before, state_after)
    SELECT CAST(:actor AS text), CAST(:actor_key_id AS bigint), 'job.retry', 'changed',
           t.queue, t.id, t.status, r.status
    FROM target t JOIN retried r ON r.id = t.id
),
events AS (
    -- The retry clears the last run's columns: what they told is written down first.
    INSERT INTO job_events (job_id, at, kind, attempt, actor, actor_key_id, instance, data)
    SELECT e.job_id, e.at, e.kind, e.attempt, e.actor, e.actor_key_id, e.instance, e.data
    FROM target t
    JOIN retried r ON r.id = t.id
    CROSS JOIN LATERAL ({{ job_event_last_run }}) e
    UNION ALL
    SELECT t.id, now(), 'retried', NULL, CAST(:actor AS text), CAST(:actor_key_id AS bigint),
           NULL, jsonb_build_object('status_before', t.status)
    FROM target t JOIN retried r ON r.id = t.id
)
SELECT true AS changed, retried.* FROM retried
UNION ALL
SELECT false AS changed, target.* FROM target WHERE NOT EXISTS (SELECT 1 FROM retried);

-- name: job_run_now
-- Makes a scheduled job (waiting for its run_at or for a retry's backoff) due now, recording it in audit_log and job_events; answers the job as it is now, its status before and whether this call changed it.
WITH target AS (
    SELECT * FROM jobs WHERE id = :id FOR UPDATE
),
moved AS (
    UPDATE jobs j
    SET status = 'pending', run_at = now(), updated_at = now()
    FROM target t
    WHERE j.id = t.id AND t.status = 'scheduled'
    RETURNING j.*
),
audited AS (
    INSERT INTO audit_log (actor, actor_key_id, action, outcome, queue, job_id,
                           state_before, state_after)
    SELECT CAST(:actor AS text), CAST(:actor_key_id AS bigint), 'job.run_now', 'changed',
           t.queue, t.id, t.status, m.status
    FROM target t JOIN moved m ON m.id = t.id
),
events AS (
    INSERT INTO job_events (job_id, kind, actor, actor_key_id, data)
    SELECT t.id, 'run_now', CAST(:actor AS text), CAST(:actor_key_id AS bigint),
           jsonb_build_object('run_at_before', t.run_at)
    FROM target t JOIN moved m ON m.id = t.id
)
SELECT true AS changed, target.status AS status_before, moved.* FROM moved, target
UNION ALL
SELECT false AS changed, target.status AS status_before, target.*
FROM target WHERE NOT EXISTS (SELECT 1 FROM moved);

-- name: job_blockers
-- What may hold one job back now: its queue paused; its key's or queue's running slots full or rate bucket empty (as the claim last left their flow_state rows); how many workers seen in the last :live_seconds poll its queue; for a waiting job, its unfinished parents and the job of its ordering key that goes first.
SELECT j.id, j.status, j.queue, j.concurrency_key, j.run_at, j.ordering_key,
       (SELECT array_agg(p.id ORDER BY p.id) FROM jobs p
        WHERE j.status = 'waiting' AND p.id = ANY (j.depends_on)
          AND p.status NOT IN ('succeeded', 'dead', 'cancelled')) AS parents_open,
       -- The key's head (its open job that is not waiting), else the earliest open one.
       (SELECT o.id FROM jobs o
        WHERE j.status = 'waiting' AND o.queue = j.queue AND o.ordering_key = j.ordering_key
          AND o.id <> j.id AND o.status IN ('waiting', 'scheduled', 'pending', 'running')
        ORDER BY o.status = 'waiting', o.id
        LIMIT 1) AS ordering_ahead,
       COALESCE(q.paused, false) AS queue_paused,
       ks.running AS key_running, ks.max_running AS key_max_running,
       CASE WHEN ks.blocked_until > now() THEN ks.blocked_until END AS key_blocked_until,
       qs.running AS queue_running, qs.max_running AS queue_max_running,
       CASE WHEN qs.blocked_until > now() THEN qs.blocked_until END AS queue_blocked_until,
       (SELECT count(*) FROM workers w
        WHERE j.queue = ANY (w.queues)
          AND w.last_seen_at > now() - make_interval(secs => CAST(:live_seconds AS float8)))
           AS live_workers
FROM jobs j
LEFT JOIN queues q ON q.name = j.queue
LEFT JOIN flow_state ks ON ks.key = 'key:' || j.queue || '|' || j.concurrency_key
LEFT JOIN flow_state qs ON qs.key = 'queue:' || j.queue
WHERE j.id = :id;

-- name: job_due_in_queues
-- Counts (up to :cap) due pending jobs in each of the given unpaused queues, for the long-poll backstop.
SELECT q.name AS queue,
       (SELECT count(*) FROM (
            SELECT 1 FROM jobs j
            WHERE j.queue = q.name AND j.status = 'pending' AND j.run_at <= now()
            -- In claim order: a walk of ix_jobs_claimable's first rows for this queue only.
            ORDER BY j.priority DESC, j.run_at, j.id
            LIMIT :cap) due_rows) AS due
FROM unnest(CAST(:queues AS text[])) AS q(name)
WHERE NOT EXISTS (SELECT 1 FROM queues p WHERE p.name = q.name AND p.paused);

-- name: job_await_mark
-- Marks an unfinished job as awaited, so that its finish notifies jobq_finished; no row: finished, awaited already, or unknown.
-- Race-free: a transaction finishing the job either holds the row (this statement waits, then
-- re-checks the status on the row it committed) or takes it after this one, and then writes its
-- new version from this one, awaited = true, which fires the trigger. A job awaited already is
-- left alone (no new row version); a plain read after this statement tells the three cases
-- apart, in a snapshot taken after it (a read in the same statement would not see a finish
-- this one waited for). updated_at is left as it is: waiting is no change of the job.
UPDATE jobs SET awaited = true
WHERE id = :id
  AND status NOT IN ('succeeded', 'dead', 'cancelled')
  AND NOT awaited
RETURNING *;

-- name: job_await_settled
-- Of the given job ids, those finished or gone: the result waiters' safety net against a lost notification.
SELECT w.id
FROM unnest(CAST(:ids AS bigint[])) AS w(id)
WHERE NOT EXISTS (
    SELECT 1 FROM jobs j
    WHERE j.id = w.id AND j.status NOT IN ('succeeded', 'dead', 'cancelled')
);

-- name: worker_list
-- Lists the workers holding leases now (a worker is its id within its API key), with the jobs they hold, the instances that granted them, when the worker last claimed or heartbeat, and the lease expiries; with :queue_patterns (LIKE patterns), only jobs of matching queues.
-- Walks ix_jobs_running_lease_expires_at: its size is the running jobs, not the history.
SELECT j.worker_id,
       k.name AS key_name,
       count(*) AS jobs_held,
       array_agg(j.id ORDER BY j.id) AS job_ids,
       array_agg(j.lease_expires_at ORDER BY j.id) AS lease_expiries,
       string_agg(DISTINCT j.lease_instance, ', ') AS instance,
       min(j.lease_expires_at) AS next_lease_expiry,
       max(j.updated_at) AS last_seen_at
FROM jobs j
LEFT JOIN api_keys k ON k.id = j.lease_key_id
WHERE j.status = 'running' AND j.lease_expires_at IS NOT NULL
  AND (CAST(:queue_patterns AS text[]) IS NULL
       OR j.queue LIKE ANY (CAST(:queue_patterns AS text[])))
GROUP BY j.worker_id, j.lease_key_id, k.name
ORDER BY j.worker_id, j.lease_key_id;
