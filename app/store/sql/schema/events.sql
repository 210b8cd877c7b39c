-- A job's history (job_events): removed with the job.
--
-- The current definition of each function, trigger and view of this area: app/store/schema.py says
-- how these files are read, applied and checked.

-- function: jobq_events_deleted
-- After a DELETE from jobs: deletes the history rows of the jobs deleted.
CREATE OR REPLACE FUNCTION __S__.jobq_events_deleted()
 RETURNS trigger
 LANGUAGE plpgsql
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
BEGIN
    DELETE FROM __S__.job_events e USING jobq_old o WHERE e.job_id = o.id;
    RETURN NULL;
END $function$;

-- function: jobq_events_truncated
-- After TRUNCATE jobs: empties job_events.
CREATE OR REPLACE FUNCTION __S__.jobq_events_truncated()
 RETURNS trigger
 LANGUAGE plpgsql
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
BEGIN
    TRUNCATE __S__.job_events;
    RETURN NULL;
END $function$;

-- trigger: jobs_events_deleted
-- Statement-level, once per DELETE.
CREATE TRIGGER jobs_events_deleted AFTER DELETE ON __S__.jobs REFERENCING OLD TABLE AS jobq_old FOR EACH STATEMENT EXECUTE FUNCTION jobq_events_deleted();

-- trigger: jobs_events_truncated
-- Once per TRUNCATE of jobs.
CREATE TRIGGER jobs_events_truncated AFTER TRUNCATE ON __S__.jobs FOR EACH STATEMENT EXECUTE FUNCTION jobq_events_truncated();
