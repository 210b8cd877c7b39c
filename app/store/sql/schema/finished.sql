-- What a job's end sets off: the jobq_finished notification for waiting readers, and webhook
-- deliveries.
--
-- The current definition of each function, trigger and view of this area: app/store/schema.py says
-- how these files are read, applied and checked.

-- function: jobq_notify_finished
-- Sends pg_notify('jobq_finished', <job id>) at commit: app/queue/results.py wakes whoever waits
-- for that job (GET /v1/jobs/{id}?wait_seconds).
CREATE OR REPLACE FUNCTION __S__.jobq_notify_finished()
 RETURNS trigger
 LANGUAGE plpgsql
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
BEGIN
    -- The channel app/queue/results.py listens on; the payload is the job id.
    IF TG_OP = 'DELETE' THEN
        PERFORM pg_notify('jobq_finished', OLD.id::text);
    ELSE
        PERFORM pg_notify('jobq_finished', NEW.id::text);
    END IF;
    RETURN NULL;
END $function$;

-- function: jobq_webhook_finished
-- Queues a webhook delivery (webhook_deliveries) with the job's outcome as this finish left it,
-- for the delivery loop (app/maintenance/webhooks.py).
CREATE OR REPLACE FUNCTION __S__.jobq_webhook_finished()
 RETURNS trigger
 LANGUAGE plpgsql
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
DECLARE
    delivery uuid := gen_random_uuid();
BEGIN
    -- The outcome as this finish left it: a later retry and finish is a delivery of its own.
    INSERT INTO __S__.webhook_deliveries (id, job_id, url, key_id, body)
    VALUES (delivery, NEW.id, NEW.callback_url, NEW.callback_key_id,
            jsonb_build_object(
                'delivery_id', delivery,
                'event', 'job.finished',
                'job_id', NEW.id,
                'queue', NEW.queue,
                'type', NEW.type,
                'status', NEW.status,
                'result', NEW.result,
                'last_error', NEW.last_error,
                'attempts', NEW.attempts,
                'max_attempts', NEW.max_attempts,
                'finished_at', to_char(COALESCE(NEW.finished_at, now()) AT TIME ZONE 'UTC',
                                       'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')));
    RETURN NULL;
END $function$;

-- function: jobq_webhook_secret
-- A new signing secret for webhooks (whsec_ and 64 hex characters): the default of
-- api_keys.webhook_secret.
CREATE OR REPLACE FUNCTION __S__.jobq_webhook_secret()
 RETURNS text
 LANGUAGE sql
AS $function$
    SELECT 'whsec_' || encode(sha256(convert_to(
        gen_random_uuid()::text || gen_random_uuid()::text, 'UTF8')), 'hex')
$function$;

-- trigger: jobs_notify_finished
-- Row-level, after an UPDATE of status that ends an awaited job.
CREATE TRIGGER jobs_notify_finished AFTER UPDATE OF status ON __S__.jobs FOR EACH ROW WHEN ((new.awaited AND (new.status = ANY (ARRAY['succeeded'::text, 'dead'::text, 'cancelled'::text])) AND (old.status IS DISTINCT FROM new.status))) EXECUTE FUNCTION jobq_notify_finished();

-- trigger: jobs_notify_deleted
-- Row-level, after a DELETE of an awaited job that had not ended.
CREATE TRIGGER jobs_notify_deleted AFTER DELETE ON __S__.jobs FOR EACH ROW WHEN ((old.awaited AND (old.status <> ALL (ARRAY['succeeded'::text, 'dead'::text, 'cancelled'::text])))) EXECUTE FUNCTION jobq_notify_finished();

-- trigger: jobs_webhook_finished
-- Row-level, after an UPDATE of status that ends a job with a callback_url.
CREATE TRIGGER jobs_webhook_finished AFTER UPDATE OF status ON __S__.jobs FOR EACH ROW WHEN (((new.callback_url IS NOT NULL) AND (new.status = ANY (ARRAY['succeeded'::text, 'dead'::text, 'cancelled'::text])) AND (old.status IS DISTINCT FROM new.status))) EXECUTE FUNCTION jobq_webhook_finished();

-- trigger: jobs_webhook_inserted
-- Row-level, after an INSERT of a job with a callback_url that is already ended (a dependent
-- cancelled at enqueue).
CREATE TRIGGER jobs_webhook_inserted AFTER INSERT ON __S__.jobs FOR EACH ROW WHEN (((new.callback_url IS NOT NULL) AND (new.status = ANY (ARRAY['succeeded'::text, 'dead'::text, 'cancelled'::text])))) EXECUTE FUNCTION jobq_webhook_finished();
