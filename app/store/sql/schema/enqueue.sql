-- Enqueueing from SQL: jobq.enqueue(), for producers that write in their own transaction.
--
-- The current definition of each function, trigger and view of this area: app/store/schema.py says
-- how these files are read, applied and checked.

-- function: jobq.enqueue
-- Enqueues one job from SQL, in the caller's transaction: checks every argument as POST /v1/jobs
-- does (names, sizes, nesting, limits from jobq.enqueue_limits), answers the existing job's id for
-- a repeated idempotency key, and wakes long-polling claims at commit unless wake is false.
-- SECURITY DEFINER, owned by the NOLOGIN role jobq_definer, which holds only the column rights it
-- needs; its path is pinned, so no overload a caller creates can run in it.
CREATE OR REPLACE FUNCTION jobq.enqueue(queue text, type text, payload jsonb DEFAULT 'null'::jsonb, priority integer DEFAULT 0, run_at timestamp with time zone DEFAULT NULL::timestamp with time zone, delay_seconds double precision DEFAULT NULL::double precision, max_attempts integer DEFAULT NULL::integer, lease_seconds integer DEFAULT NULL::integer, timeout_seconds integer DEFAULT NULL::integer, idempotency_key text DEFAULT NULL::text, concurrency_key text DEFAULT NULL::text, traceparent text DEFAULT NULL::text, wake boolean DEFAULT true)
 RETURNS bigint
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
#variable_conflict use_column
DECLARE
    lim jobq.enqueue_limits;
    body text;
    due timestamptz;
    fingerprint text;
    new_id bigint;
    existing record;
BEGIN
    SELECT * INTO lim FROM jobq.enqueue_limits;
    IF NOT FOUND THEN
        lim := ROW(true, 128, 255, 255, 255, 1048576, 10, 30, now(), 64);
    END IF;
    IF enqueue.queue IS NULL OR enqueue.queue !~ '^[A-Za-z0-9][A-Za-z0-9_.:-]*$'
       OR length(enqueue.queue) > lim.queue_name_max_chars THEN
        RAISE EXCEPTION 'jobq.enqueue: queue: a letter or digit, then letters, digits, _ . : -, at most % characters', lim.queue_name_max_chars
            USING ERRCODE = '22023', COLUMN = 'queue';
    END IF;
    IF enqueue.type IS NULL OR length(enqueue.type) NOT BETWEEN 1 AND lim.type_max_chars THEN
        RAISE EXCEPTION 'jobq.enqueue: type: 1 to % characters', lim.type_max_chars
            USING ERRCODE = '22023', COLUMN = 'type';
    END IF;
    body := COALESCE(enqueue.payload, 'null'::jsonb)::text;
    IF octet_length(body) > lim.payload_max_bytes THEN
        RAISE EXCEPTION 'jobq.enqueue: payload: at most % bytes as JSON text', lim.payload_max_bytes
            USING ERRCODE = '22023', COLUMN = 'payload';
    END IF;
    -- Nesting, as POST /v1/jobs counts it: the body's object is the first level, so a payload
    -- nests one level fewer than json_max_depth. A container at level d needs 2d characters,
    -- so only longer text is walked.
    IF octet_length(body) >= 2 * (lim.json_max_depth - 1)
       AND jsonb_path_exists(enqueue.payload,
                             ('strict $.**{' || (lim.json_max_depth - 1)
                              || ' to last} ? (@.type() == "object" || @.type() == "array")')::jsonpath)
    THEN
        RAISE EXCEPTION 'jobq.enqueue: payload: nesting deeper than % levels', lim.json_max_depth - 1
            USING ERRCODE = '22023', COLUMN = 'payload';
    END IF;
    -- A number beyond a double's range has 309 digits or more in jsonb's text (a regular
    -- expression counts to 255 at most: 250 and 59), so only such text is walked.
    IF body ~ '[0-9]{250}[0-9]{59}' AND jsonb_path_exists(enqueue.payload, 'strict $.** ? (@.type() == "number" && @.abs() >= 179769313486231580793728971405303415079934132710037826936173778980444968292764750946649017977587207096330286416692887910946555547851940402630657488671505820681908902000708383676273854845817711531764475730270069855571366959622842914819860834936475292719074168444365510704342711559699508093042880177904174497792)') THEN
        RAISE EXCEPTION 'jobq.enqueue: payload: a number beyond a double''s range (about 1.8e308), which JSON readers of other languages cannot take'
            USING ERRCODE = '22023', COLUMN = 'payload';
    END IF;
    IF enqueue.priority IS NULL THEN
        RAISE EXCEPTION 'jobq.enqueue: priority: an integer, not null'
            USING ERRCODE = '22023', COLUMN = 'priority';
    END IF;
    IF enqueue.run_at IS NOT NULL AND enqueue.delay_seconds IS NOT NULL THEN
        RAISE EXCEPTION 'jobq.enqueue: run_at: give run_at or delay_seconds, not both'
            USING ERRCODE = '22023', COLUMN = 'run_at';
    END IF;
    IF enqueue.run_at IS NOT NULL AND NOT (enqueue.run_at >= '1970-01-01 00:00:00+00'
                                          AND enqueue.run_at < '9000-01-01 00:00:00+00') THEN
        RAISE EXCEPTION 'jobq.enqueue: run_at: must lie between 1970-01-01 and 9000-01-01 (exclusive) in UTC'
            USING ERRCODE = '22023', COLUMN = 'run_at';
    END IF;
    IF enqueue.delay_seconds IS NOT NULL AND NOT (enqueue.delay_seconds >= 0
                                                 AND enqueue.delay_seconds <= 316224000) THEN
        RAISE EXCEPTION 'jobq.enqueue: delay_seconds: 0 to 316224000'
            USING ERRCODE = '22023', COLUMN = 'delay_seconds';
    END IF;
    IF enqueue.max_attempts IS NOT NULL AND enqueue.max_attempts NOT BETWEEN 1 AND 1000 THEN
        RAISE EXCEPTION 'jobq.enqueue: max_attempts: 1 to 1000'
            USING ERRCODE = '22023', COLUMN = 'max_attempts';
    END IF;
    IF enqueue.lease_seconds IS NOT NULL AND enqueue.lease_seconds NOT BETWEEN 1 AND 43200 THEN
        RAISE EXCEPTION 'jobq.enqueue: lease_seconds: 1 to 43200'
            USING ERRCODE = '22023', COLUMN = 'lease_seconds';
    END IF;
    IF enqueue.timeout_seconds IS NOT NULL AND enqueue.timeout_seconds NOT BETWEEN 1 AND 604800 THEN
        RAISE EXCEPTION 'jobq.enqueue: timeout_seconds: 1 to 604800'
            USING ERRCODE = '22023', COLUMN = 'timeout_seconds';
    END IF;
    IF enqueue.idempotency_key IS NOT NULL
       AND length(enqueue.idempotency_key) NOT BETWEEN 1 AND lim.idempotency_key_max_chars THEN
        RAISE EXCEPTION 'jobq.enqueue: idempotency_key: 1 to % characters', lim.idempotency_key_max_chars
            USING ERRCODE = '22023', COLUMN = 'idempotency_key';
    END IF;
    IF enqueue.concurrency_key IS NOT NULL
       AND length(enqueue.concurrency_key) NOT BETWEEN 1 AND lim.concurrency_key_max_chars THEN
        RAISE EXCEPTION 'jobq.enqueue: concurrency_key: 1 to % characters', lim.concurrency_key_max_chars
            USING ERRCODE = '22023', COLUMN = 'concurrency_key';
    END IF;

    due := COALESCE(enqueue.run_at,
                    now() + make_interval(secs => COALESCE(enqueue.delay_seconds, 0)));
    IF enqueue.idempotency_key IS NOT NULL THEN
        -- What a replay must repeat: every argument but the key (and wake, which is not the job's).
        fingerprint := 'sql:' || md5(jsonb_build_array(
            enqueue.queue, enqueue.type, enqueue.payload, enqueue.priority, enqueue.run_at,
            enqueue.delay_seconds, enqueue.max_attempts, enqueue.lease_seconds,
            enqueue.timeout_seconds, enqueue.concurrency_key)::text);
    END IF;

    INSERT INTO __S__.jobs (queue, type, payload, priority, status, max_attempts, lease_seconds,
                            timeout_seconds, run_at, idempotency_key, idempotency_hash,
                            concurrency_key, traceparent)
    VALUES (enqueue.queue, enqueue.type, COALESCE(enqueue.payload, 'null'::jsonb),
            enqueue.priority,
            CASE WHEN due > now() THEN 'scheduled' ELSE 'pending' END,
            COALESCE(enqueue.max_attempts, lim.max_attempts_default),
            COALESCE(enqueue.lease_seconds, lim.lease_seconds_default),
            enqueue.timeout_seconds, due, enqueue.idempotency_key, fingerprint,
            enqueue.concurrency_key,
            CASE WHEN enqueue.traceparent ~ '^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$'
                      AND enqueue.traceparent !~ '^00-0{32}-' AND enqueue.traceparent !~ '-0{16}-'
                 THEN enqueue.traceparent END)
    ON CONFLICT (queue, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING id INTO new_id;

    IF new_id IS NULL THEN
        SELECT j.id, j.idempotency_hash INTO existing
        FROM __S__.jobs j
        WHERE j.queue = enqueue.queue AND j.idempotency_key = enqueue.idempotency_key;
        IF existing.idempotency_hash IS DISTINCT FROM fingerprint THEN
            RAISE EXCEPTION 'jobq.enqueue: idempotency_key: already used by job % with other arguments', existing.id
                USING ERRCODE = '23505', COLUMN = 'idempotency_key';
        END IF;
        RETURN existing.id;
    END IF;
    IF enqueue.wake AND due <= now() THEN
        -- Sent when the caller commits, never on rollback; "sql" is no instance's id.
        PERFORM pg_notify('jobq_wakeup', 'sql 1 ' || enqueue.queue);
    END IF;
    RETURN new_id;
END
$function$;
