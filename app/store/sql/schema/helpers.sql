-- Pure functions the service's statements call: no table, no side effect beyond random().
--
-- The current definition of each function, trigger and view of this area: app/store/schema.py says
-- how these files are read, applied and checked.

-- function: jobq_backoff
-- The delay before retry attempt n: base x 2^(n-1) seconds, at most cap, with full jitter (a
-- uniform fraction of it).
CREATE OR REPLACE FUNCTION __S__.jobq_backoff(attempt integer, base double precision, cap double precision)
 RETURNS interval
 LANGUAGE sql
 PARALLEL SAFE
AS $function$
            SELECT make_interval(secs => LEAST(cap, base * power(2::float8, LEAST(GREATEST(attempt - 1, 0), 62)))
                                         * (1 - random()))
        $function$;

-- function: jobq_errors_append
-- A job's error history (jsonb array) with one entry appended, keeping the newest keep entries.
CREATE OR REPLACE FUNCTION __S__.jobq_errors_append(history jsonb, entry jsonb, keep integer)
 RETURNS jsonb
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE
AS $function$
            SELECT COALESCE(jsonb_agg(e ORDER BY ord), '[]'::jsonb)
            FROM (
                SELECT e, ord
                FROM jsonb_array_elements(COALESCE(history, '[]'::jsonb) || jsonb_build_array(entry))
                     WITH ORDINALITY AS t(e, ord)
                ORDER BY ord DESC
                LIMIT keep
            ) newest
        $function$;

-- function: jobq_failure_pattern
-- A failure message's fingerprint text: its first 2,000 characters with quoted values, URL
-- queries, e-mail addresses, numbers and identifiers containing digits replaced by placeholders,
-- so failures that differ only in those group together.
CREATE OR REPLACE FUNCTION __S__.jobq_failure_pattern(message text)
 RETURNS text
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE
AS $function$
    SELECT regexp_replace(regexp_replace(regexp_replace(regexp_replace(regexp_replace(
           regexp_replace(regexp_replace(
        left(message, 2000),
        '(?<![[:alnum:]])''[^'']*''(?![[:alnum:]])', '''?''', 'g'),
        '"[^"]*"', '"?"', 'g'),
        '`[^`]*`', '`?`', 'g'),
        '([[:alpha:]][[:alnum:]+.-]*://[^[:space:]?#''"<>]*)[?#][^[:space:]''"<>]*',
        '\1?<query>', 'g'),
        '[[:alnum:]._%+-]+@[[:alnum:].-]+\.[[:alpha:]]{2,}', '<email>', 'g'),
        '(?<![[:alnum:]_.@+~%#$-])[0-9]+(\.[0-9]+)*(?![[:alnum:]_@+~%#$-]|\.[[:alnum:]_])',
        '<n>', 'g'),
        '(?<![[:alnum:]_.@+~%#$-])[[:alnum:]_.@+~%#$-]*[0-9]([[:alnum:]_.@+~%#$-]*[[:alnum:]_])?',
        '<id>', 'g')
$function$;

-- function: jobq_mask_message
-- The older fingerprint text (quoted values, UUIDs, long hex and numbers masked), kept for the
-- rows and the previous release that used it; jobq_failure_pattern replaced it.
CREATE OR REPLACE FUNCTION __S__.jobq_mask_message(message text)
 RETURNS text
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE
AS $function$
    SELECT regexp_replace(regexp_replace(regexp_replace(regexp_replace(regexp_replace(
        left(message, 2000),
        '''[^'']*''', '''?''', 'g'),
        '"[^"]*"', '"?"', 'g'),
        '[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}', '<uuid>', 'gi'),
        '\m(0x[0-9a-f]+|(?=[a-f]*[0-9])[0-9a-f]{8,})\M', '<hex>', 'gi'),
        '\m[0-9]+(\.[0-9]+)?\M', '<n>', 'g')
$function$;

-- function: jobq_progress_decile
-- Which tenth of its work a job's progress ({done, total}) has reached, 0 to 10, or NULL when
-- progress says no such numbers.
CREATE OR REPLACE FUNCTION __S__.jobq_progress_decile(progress jsonb)
 RETURNS integer
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE
AS $function$
    SELECT CASE
        WHEN jsonb_typeof(progress->'done') = 'number' AND jsonb_typeof(progress->'total') = 'number'
             AND (progress->>'total')::float8 > 0
        THEN LEAST(GREATEST(floor(10 * (progress->>'done')::float8
                                  / (progress->>'total')::float8), 0), 10)::int
    END
$function$;
