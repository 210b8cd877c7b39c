-- Concurrency keys: the slots running jobs hold, counted in flow_state and flow_released.
--
-- The current definition of each function, trigger and view of this area: app/store/schema.py says
-- how these files are read, applied and checked.

-- function: jobq_flow_counted_updated
-- After an UPDATE of jobs: for jobs that hold slots (flow_keys) and left or entered running,
-- appends the slots freed to flow_released and adds the slots taken to flow_state.running (rows
-- the claim already locked). Returns at once when no job of the statement holds slots; a heartbeat
-- moves nothing.
CREATE OR REPLACE FUNCTION __S__.jobq_flow_counted_updated()
 RETURNS trigger
 LANGUAGE plpgsql
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
DECLARE
    moved_keys text[];
    deltas int[];
BEGIN
    -- The common case, no job of the statement holds slots: a scan of each transition table.
    IF NOT EXISTS (SELECT 1 FROM jobq_old WHERE flow_keys IS NOT NULL AND status = 'running')
       AND NOT EXISTS (SELECT 1 FROM jobq_new WHERE flow_keys IS NOT NULL AND status = 'running')
    THEN
        RETURN NULL;
    END IF;
    -- A heartbeat moves nothing and writes nothing.
    SELECT array_agg(key ORDER BY key), array_agg(delta ORDER BY key) INTO moved_keys, deltas
    FROM (
        SELECT key, sum(delta)::int AS delta
        FROM (
            SELECT unnest(flow_keys) AS key, -1 AS delta FROM jobq_old
            WHERE flow_keys IS NOT NULL AND status = 'running'
            UNION ALL
            SELECT unnest(flow_keys), 1 FROM jobq_new
            WHERE flow_keys IS NOT NULL AND status = 'running'
        ) m
        GROUP BY key
        HAVING sum(delta) <> 0
    ) moves;
    IF moved_keys IS NULL THEN
        RETURN NULL;
    END IF;
    INSERT INTO __S__.flow_released (key, n)
    SELECT m.key, -m.delta FROM unnest(moved_keys, deltas) AS m(key, delta) WHERE m.delta < 0;
    IF EXISTS (SELECT 1 FROM unnest(deltas) AS d WHERE d > 0) THEN
        -- Only a claim takes slots, and it holds these rows already: no wait, no deadlock.
        PERFORM 1 FROM __S__.flow_state f
        WHERE f.key IN (SELECT m.key FROM unnest(moved_keys, deltas) AS m(key, delta)
                        WHERE m.delta > 0)
        ORDER BY f.key FOR UPDATE;
        UPDATE __S__.flow_state f
        SET running = f.running + m.delta, updated_at = now()
        FROM unnest(moved_keys, deltas) AS m(key, delta)
        WHERE f.key = m.key AND m.delta > 0;
    END IF;
    RETURN NULL;
END $function$;

-- function: jobq_flow_counted_deleted
-- After a DELETE from jobs: a running job deleted frees its slots (appended to flow_released).
CREATE OR REPLACE FUNCTION __S__.jobq_flow_counted_deleted()
 RETURNS trigger
 LANGUAGE plpgsql
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
BEGIN
    INSERT INTO __S__.flow_released (key, n)
    SELECT key, count(*)::int
    FROM (SELECT unnest(flow_keys) AS key FROM jobq_old
          WHERE flow_keys IS NOT NULL AND status = 'running') m
    GROUP BY key;
    RETURN NULL;
END $function$;

-- function: jobq_flow_truncated
-- After TRUNCATE jobs: empties flow_state and flow_released.
CREATE OR REPLACE FUNCTION __S__.jobq_flow_truncated()
 RETURNS trigger
 LANGUAGE plpgsql
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
BEGIN
    DELETE FROM __S__.flow_state;
    DELETE FROM __S__.flow_released;
    RETURN NULL;
END $function$;

-- trigger: jobs_flow_counted_updated
-- Statement-level, once per UPDATE.
CREATE TRIGGER jobs_flow_counted_updated AFTER UPDATE ON __S__.jobs REFERENCING OLD TABLE AS jobq_old NEW TABLE AS jobq_new FOR EACH STATEMENT EXECUTE FUNCTION jobq_flow_counted_updated();

-- trigger: jobs_flow_counted_deleted
-- Statement-level, once per DELETE.
CREATE TRIGGER jobs_flow_counted_deleted AFTER DELETE ON __S__.jobs REFERENCING OLD TABLE AS jobq_old FOR EACH STATEMENT EXECUTE FUNCTION jobq_flow_counted_deleted();

-- trigger: jobs_flow_truncated
-- Once per TRUNCATE of jobs.
CREATE TRIGGER jobs_flow_truncated AFTER TRUNCATE ON __S__.jobs FOR EACH STATEMENT EXECUTE FUNCTION jobq_flow_truncated();

-- view: flow_running
-- The jobs running under each concurrency key: flow_state.running less the slots released since
-- the last fold, never below 0.
CREATE OR REPLACE VIEW __S__.flow_running AS
 SELECT f.key,
    (GREATEST((f.running - COALESCE(( SELECT sum(r.n) AS sum
           FROM flow_released r
          WHERE (r.key = f.key)), (0)::bigint)), (0)::bigint))::integer AS running
   FROM flow_state f;
