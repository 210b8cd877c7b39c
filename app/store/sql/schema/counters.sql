-- Queue counts and throughput: an append-only journal the triggers write, folded into sums.
--
-- The current definition of each function, trigger and view of this area: app/store/schema.py says
-- how these files are read, applied and checked.

-- function: jobq_counts_inserted
-- After an INSERT into jobs: appends one queue_counts row per (queue, status) it added, +n, to the
-- journal slot counter_journal_slot names.
CREATE OR REPLACE FUNCTION __S__.jobq_counts_inserted()
 RETURNS trigger
 LANGUAGE plpgsql
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
BEGIN
    INSERT INTO __S__.queue_counts (queue, status, slot, jobs)
    SELECT queue, status, (SELECT s.slot FROM __S__.counter_journal_slot s), count(*) FROM jobq_new GROUP BY queue, status;
    RETURN NULL;
END $function$;

-- function: jobq_counts_updated
-- After an UPDATE of jobs: for the jobs whose status or queue changed, appends -n for each (queue,
-- status) they left and +n for each they entered, and one queue_throughput row per (queue, minute,
-- outcome) for those that finished or whose attempt failed (fail, expire, timeout).
CREATE OR REPLACE FUNCTION __S__.jobq_counts_updated()
 RETURNS trigger
 LANGUAGE plpgsql
 SET enable_nestloop TO 'off'
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
BEGIN
    WITH moved AS MATERIALIZED (
        SELECT o.queue AS old_queue, o.status AS old_status, n.queue, n.status,
               n.lease_ended_by
        FROM jobq_old o JOIN jobq_new n ON n.id = o.id
        WHERE n.status <> o.status OR n.queue <> o.queue
    ),
    outcomes AS (
        INSERT INTO __S__.queue_throughput (queue, minute, outcome, slot, jobs)
        SELECT queue, date_trunc('minute', now()),
               CASE WHEN status IN ('succeeded', 'dead', 'cancelled') THEN status ELSE 'failed' END,
               (SELECT s.slot FROM __S__.counter_journal_slot s), count(*)
        FROM moved
        WHERE status <> old_status
          AND (status IN ('succeeded', 'dead', 'cancelled')
               OR (old_status = 'running' AND lease_ended_by IN ('fail', 'expire', 'timeout')))
        GROUP BY 1, 2, 3
    )
    INSERT INTO __S__.queue_counts (queue, status, slot, jobs)
    SELECT old_queue, old_status, (SELECT s.slot FROM __S__.counter_journal_slot s), -count(*) FROM moved GROUP BY 1, 2
    UNION ALL
    SELECT queue, status, (SELECT s.slot FROM __S__.counter_journal_slot s), count(*) FROM moved GROUP BY 1, 2;
    RETURN NULL;
END $function$;

-- function: jobq_counts_deleted
-- After a DELETE from jobs: appends -n per (queue, status) removed.
CREATE OR REPLACE FUNCTION __S__.jobq_counts_deleted()
 RETURNS trigger
 LANGUAGE plpgsql
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
BEGIN
    INSERT INTO __S__.queue_counts (queue, status, slot, jobs)
    SELECT queue, status, (SELECT s.slot FROM __S__.counter_journal_slot s), -count(*) FROM jobq_old GROUP BY queue, status;
    RETURN NULL;
END $function$;

-- function: jobq_counts_truncated
-- After TRUNCATE jobs: empties the counters the same way.
CREATE OR REPLACE FUNCTION __S__.jobq_counts_truncated()
 RETURNS trigger
 LANGUAGE plpgsql
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
BEGIN
    -- Whoever may empty jobs empties its counters the same way, leaving no dead rows.
    TRUNCATE __S__.queue_counts, __S__.queue_throughput;
    RETURN NULL;
END $function$;

-- function: jobq_counters_fold
-- The fold (the leader's counters loop, after it turned counter_journal_slot to the other slot):
-- locks the slot left behind (waiting at most lock_timeout_ms for the statements that appended to
-- it; answers NULL if they hold it longer), adds its sums into slot 0 (queue_counts_totals,
-- queue_throughput_totals; a (queue, status) that reaches 0 leaves no row) and TRUNCATEs it.
-- Answers the journal rows folded. TRUNCATE leaves no dead tuple whatever the vacuum horizon
-- (docs/architecture/storage-dead-rows.md).
CREATE OR REPLACE FUNCTION __S__.jobq_counters_fold(lock_timeout_ms integer)
 RETURNS bigint
 LANGUAGE plpgsql
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
DECLARE
    folding smallint;
    counted bigint;
    outcomes bigint;
BEGIN
    SELECT 3 - s.slot INTO folding FROM __S__.counter_journal_slot s;
    PERFORM set_config('lock_timeout', lock_timeout_ms || 'ms', true);
    BEGIN
        -- Waits for the transactions that appended to the slot before it was turned away from.
        IF folding = 1 THEN
            LOCK TABLE __S__.queue_counts_slot1, __S__.queue_throughput_slot1
                IN ACCESS EXCLUSIVE MODE;
        ELSE
            LOCK TABLE __S__.queue_counts_slot2, __S__.queue_throughput_slot2
                IN ACCESS EXCLUSIVE MODE;
        END IF;
    EXCEPTION WHEN lock_not_available THEN
        RETURN NULL;
    END;
    PERFORM set_config('lock_timeout', '0', true);

    SELECT count(*) INTO counted FROM __S__.queue_counts WHERE slot = folding;
    SELECT count(*) INTO outcomes FROM __S__.queue_throughput WHERE slot = folding;
    IF counted > 0 THEN
        INSERT INTO __S__.queue_counts_totals AS t (queue, status, slot, jobs)
        SELECT queue, status, 0, sum(jobs) FROM __S__.queue_counts WHERE slot = folding
        GROUP BY queue, status HAVING sum(jobs) <> 0
        ORDER BY queue, status
        ON CONFLICT (queue, status) DO UPDATE SET jobs = t.jobs + EXCLUDED.jobs;
        -- A (queue, state) that no job holds any more leaves no row behind, as before.
        DELETE FROM __S__.queue_counts_totals t
        WHERE t.jobs = 0
          AND (t.queue, t.status) IN (SELECT queue, status FROM __S__.queue_counts
                                      WHERE slot = folding);
    END IF;
    IF outcomes > 0 THEN
        INSERT INTO __S__.queue_throughput_totals AS t (queue, minute, outcome, slot, jobs)
        SELECT queue, minute, outcome, 0, sum(jobs) FROM __S__.queue_throughput
        WHERE slot = folding
        GROUP BY queue, minute, outcome
        ORDER BY queue, minute, outcome
        ON CONFLICT (queue, minute, outcome) DO UPDATE SET jobs = t.jobs + EXCLUDED.jobs;
    END IF;
    -- A TRUNCATE gives each partition (and its TOAST table and index) a new file, which
    -- rewrites their pg_class rows: not for an empty slot, so an idle queue writes nothing.
    IF counted = 0 AND outcomes = 0 THEN
        RETURN 0;
    ELSIF folding = 1 THEN
        TRUNCATE __S__.queue_counts_slot1, __S__.queue_throughput_slot1;
    ELSE
        TRUNCATE __S__.queue_counts_slot2, __S__.queue_throughput_slot2;
    END IF;
    RETURN GREATEST(counted, outcomes);
END $function$;

-- trigger: jobs_counts_inserted
-- Statement-level, once per INSERT, with the inserted rows as jobq_new.
CREATE TRIGGER jobs_counts_inserted AFTER INSERT ON __S__.jobs REFERENCING NEW TABLE AS jobq_new FOR EACH STATEMENT EXECUTE FUNCTION jobq_counts_inserted();

-- trigger: jobs_counts_updated
-- Statement-level, once per UPDATE, with the rows before and after.
CREATE TRIGGER jobs_counts_updated AFTER UPDATE ON __S__.jobs REFERENCING OLD TABLE AS jobq_old NEW TABLE AS jobq_new FOR EACH STATEMENT EXECUTE FUNCTION jobq_counts_updated();

-- trigger: jobs_counts_deleted
-- Statement-level, once per DELETE.
CREATE TRIGGER jobs_counts_deleted AFTER DELETE ON __S__.jobs REFERENCING OLD TABLE AS jobq_old FOR EACH STATEMENT EXECUTE FUNCTION jobq_counts_deleted();

-- trigger: jobs_counts_truncated
-- Once per TRUNCATE of jobs.
CREATE TRIGGER jobs_counts_truncated AFTER TRUNCATE ON __S__.jobs FOR EACH STATEMENT EXECUTE FUNCTION jobq_counts_truncated();
