-- Composing work: depends_on (jobs that wait for others) and ordering_key (one job of a key at a
-- time).
--
-- The current definition of each function, trigger and view of this area: app/store/schema.py says
-- how these files are read, applied and checked.

-- function: jobq_linked_inserted
-- Before a job with depends_on or an ordering_key is inserted: sorts and de-duplicates depends_on,
-- locks the parents in id order, marks them has_dependents, refuses names that do not exist
-- (23503, column depends_on), cancels the job at once if a parent already ended dead or cancelled
-- (unless on_parent_failure is run) and makes it wait while a parent is open; for an ordering_key,
-- takes the key's row (its lock) and makes the job wait while another job of the key is open.
CREATE OR REPLACE FUNCTION __S__.jobq_linked_inserted()
 RETURNS trigger
 LANGUAGE plpgsql
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
DECLARE
    wanted int;
    found_n int;
    failed_n int;
    open_n int;
BEGIN
    IF NEW.depends_on IS NOT NULL THEN
        NEW.depends_on := ARRAY(SELECT DISTINCT d FROM unnest(NEW.depends_on) AS d ORDER BY d);
        wanted := cardinality(NEW.depends_on);
        -- Lock the parents in id order: a parent finishing now is waited for, and its finish
        -- trigger, which runs after this transaction commits, sees this job. Each statement
        -- below reads a snapshot taken after the locks, so it sees that parent finished.
        PERFORM 1 FROM __S__.jobs WHERE id = ANY (NEW.depends_on) ORDER BY id FOR NO KEY UPDATE;
        UPDATE __S__.jobs SET has_dependents = true
        WHERE id = ANY (NEW.depends_on) AND NOT has_dependents;
        SELECT count(*),
               count(*) FILTER (WHERE status IN ('dead', 'cancelled')),
               count(*) FILTER (WHERE status NOT IN ('succeeded', 'dead', 'cancelled'))
          INTO found_n, failed_n, open_n
        FROM __S__.jobs WHERE id = ANY (NEW.depends_on);
        IF found_n < wanted THEN
            RAISE EXCEPTION 'depends_on: % of the % jobs named do not exist', wanted - found_n, wanted
                USING ERRCODE = '23503', COLUMN = 'depends_on';
        END IF;
        IF failed_n > 0 AND NEW.on_parent_failure IS DISTINCT FROM 'run' THEN
            NEW.status := 'cancelled';
            NEW.finished_at := now();
            INSERT INTO __S__.job_events (job_id, kind, data)
            VALUES (NEW.id, 'cancelled', jsonb_build_object(
                'status_before', 'waiting', 'reason', 'a parent ended dead or cancelled'));
        ELSIF open_n > 0 THEN
            NEW.status := 'waiting';
        END IF;
    END IF;
    IF NEW.ordering_key IS NOT NULL AND NEW.status NOT IN ('succeeded', 'dead', 'cancelled') THEN
        -- The key's row is its lock: enqueues and finishes of one key take turns on it.
        INSERT INTO __S__.ordering_keys AS k (queue, ordering_key)
        VALUES (NEW.queue, NEW.ordering_key)
        ON CONFLICT (queue, ordering_key) DO UPDATE SET updated_at = now();
        IF EXISTS (SELECT 1 FROM __S__.jobs
                   WHERE queue = NEW.queue AND ordering_key = NEW.ordering_key
                     AND status IN ('waiting', 'scheduled', 'pending', 'running')) THEN
            NEW.status := 'waiting';
        END IF;
    END IF;
    RETURN NEW;
END $function$;

-- function: jobq_linked_ready
-- Records that a job became ready after another ended (a 'ready' event) and wakes long-polling
-- claims of its queue if it is pending.
CREATE OR REPLACE FUNCTION __S__.jobq_linked_ready(ready_id bigint, ready_queue text, ready_status text, after_id bigint)
 RETURNS void
 LANGUAGE plpgsql
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
BEGIN
    INSERT INTO __S__.job_events (job_id, kind, data)
    VALUES (ready_id, 'ready', jsonb_build_object('after', after_id, 'status', ready_status));
    IF ready_status = 'pending' THEN
        PERFORM pg_notify('jobq_wakeup', 'sql 1 ' || ready_queue);
    END IF;
END $function$;

-- function: jobq_linked_reopened
-- Before a finished job with an ordering_key is put back (retried from the dashboard or API): it
-- waits while another job of its key is open.
CREATE OR REPLACE FUNCTION __S__.jobq_linked_reopened()
 RETURNS trigger
 LANGUAGE plpgsql
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
BEGIN
    INSERT INTO __S__.ordering_keys AS k (queue, ordering_key) VALUES (NEW.queue, NEW.ordering_key)
    ON CONFLICT (queue, ordering_key) DO UPDATE SET updated_at = now();
    IF EXISTS (SELECT 1 FROM __S__.jobs
               WHERE queue = NEW.queue AND ordering_key = NEW.ordering_key AND id <> NEW.id
                 AND status IN ('waiting', 'scheduled', 'pending', 'running')) THEN
        NEW.status := 'waiting';
    END IF;
    RETURN NEW;
END $function$;

-- function: jobq_linked_settled
-- After a job with dependents or an ordering_key ends (or is deleted before it ended): cancels, in
-- one set-based statement, every waiting job below it that needs its success (one recursive walk;
-- the jobq.cascading flag makes the firings on those rows return at once, so a 1,000-step chain
-- nests two levels deep); makes ready (pending or scheduled) the waiting dependents whose parents
-- have now all ended as they ask, recorded and announced per queue; and when no job of its
-- ordering key is open any more, makes the key's next waiting job ready.
CREATE OR REPLACE FUNCTION __S__.jobq_linked_settled()
 RETURNS trigger
 LANGUAGE plpgsql
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
DECLARE
    j __S__.jobs;
    ended text;
    doomed_ids bigint[];
    ended_ids bigint[];
    woken_queues text[];
    woken_counts bigint[];
    moved record;
BEGIN
    -- A job the cascade below cancels fires this trigger too, at the end of the cascade's
    -- statement; the cascade does that job's work itself, set-based, so the call returns at
    -- once. Without this, each link of a chain nested one call deeper: a chain of about 700
    -- overflowed PostgreSQL's stack.
    IF current_setting('jobq.cascading', true) = 'on' THEN
        RETURN NULL;
    END IF;
    IF TG_OP = 'DELETE' THEN
        j := OLD;
        ended := 'cancelled';  -- a parent deleted before it finished never succeeds
    ELSE
        j := NEW;
        ended := NEW.status;
    END IF;
    ended_ids := ARRAY[j.id];

    IF j.has_dependents AND ended <> 'succeeded' THEN
        -- Every waiting job below this one that needs its parents' success, found by one walk
        -- of the graph (UNION visits each job once, a diamond too; each step one probe of
        -- ix_jobs_depends_on, which OFFSET 0 keeps from becoming a scan of jobs).
        SELECT array_agg(w.id) INTO doomed_ids
        FROM (
            WITH RECURSIVE doomed(id) AS (
                SELECT c.id FROM __S__.jobs c
                WHERE c.depends_on @> ARRAY[j.id] AND c.status = 'waiting'
                  AND c.on_parent_failure IS DISTINCT FROM 'run'
                UNION
                SELECT k.id
                FROM doomed d
                CROSS JOIN LATERAL (
                    SELECT c.id FROM __S__.jobs c
                    WHERE c.depends_on @> ARRAY[d.id] AND c.status = 'waiting'
                      AND c.on_parent_failure IS DISTINCT FROM 'run'
                    OFFSET 0
                ) k
            )
            SELECT id FROM doomed
        ) w;
        IF doomed_ids IS NOT NULL THEN
            -- One statement cancels them all (each row re-checked as it is locked), and each
            -- records the parent it was cancelled for: this job, or one cancelled with it.
            PERFORM set_config('jobq.cascading', 'on', true);
            WITH cancelled AS (
                UPDATE __S__.jobs c
                SET status = 'cancelled', finished_at = now(), updated_at = now()
                WHERE c.id = ANY (doomed_ids) AND c.status = 'waiting'
                  AND c.on_parent_failure IS DISTINCT FROM 'run'
                RETURNING c.id, c.depends_on
            ),
            recorded AS (
                INSERT INTO __S__.job_events (job_id, kind, data)
                SELECT x.id, 'cancelled', jsonb_build_object(
                           'status_before', 'waiting', 'parent_id', x.parent_id,
                           'parent_status', CASE WHEN x.parent_id = j.id THEN ended
                                                 ELSE 'cancelled' END)
                FROM (SELECT c.id,
                             CASE WHEN c.depends_on @> ARRAY[j.id] THEN j.id
                                  WHEN cardinality(c.depends_on) = 1 THEN c.depends_on[1]
                                  ELSE (SELECT p.id FROM unnest(c.depends_on) AS p(id)
                                        WHERE p.id = ANY (doomed_ids) LIMIT 1) END AS parent_id
                      FROM cancelled c) x
            )
            SELECT ended_ids || COALESCE(array_agg(c.id), '{}') INTO ended_ids FROM cancelled c;
            PERFORM set_config('jobq.cascading', '', true);
        END IF;
    END IF;

    IF j.has_dependents THEN
        -- The waiting dependents of every job that ended here are locked first, in id order;
        -- the UPDATE after reads their other parents with a snapshot taken after the locks, so
        -- two parents finishing at once cannot both miss the last one (the second finish waits
        -- for the first, then sees it).
        PERFORM 1 FROM __S__.jobs c
        WHERE c.depends_on && ended_ids AND c.status = 'waiting'
        ORDER BY c.id
        FOR NO KEY UPDATE;
        -- Those that may run now: one UPDATE, announced per queue.
        WITH ready AS (
            UPDATE __S__.jobs c
            SET status = CASE WHEN c.run_at > now() THEN 'scheduled' ELSE 'pending' END,
                updated_at = now()
            WHERE c.depends_on && ended_ids AND c.status = 'waiting'
              AND NOT EXISTS (
                  SELECT 1
                  FROM generate_subscripts(c.depends_on, 1, true) AS s(i)
                  CROSS JOIN LATERAL (SELECT p.status FROM __S__.jobs p
                                      WHERE p.id = c.depends_on[s.i]) p
                  WHERE p.status <> 'succeeded'
                    AND NOT (c.on_parent_failure = 'run' AND p.status IN ('dead', 'cancelled')))
              AND (c.ordering_key IS NULL OR NOT EXISTS (
                  SELECT 1 FROM __S__.jobs o
                  WHERE o.queue = c.queue AND o.ordering_key = c.ordering_key AND o.id <> c.id
                    AND o.status IN ('scheduled', 'pending', 'running')))
            RETURNING c.id, c.queue, c.status, c.depends_on
        ),
        recorded AS (
            INSERT INTO __S__.job_events (job_id, kind, data)
            SELECT r.id, 'ready', jsonb_build_object(
                       'after', CASE WHEN r.depends_on @> ARRAY[j.id] THEN j.id
                                     ELSE (SELECT p.id FROM unnest(r.depends_on) AS p(id)
                                           WHERE p.id = ANY (ended_ids) LIMIT 1) END,
                       'status', r.status)
            FROM ready r
        )
        SELECT array_agg(w.queue), array_agg(w.n) INTO woken_queues, woken_counts
        FROM (SELECT r.queue, count(*) AS n FROM ready r WHERE r.status = 'pending'
              GROUP BY r.queue) w;
        -- Sent at commit, dropped on rollback, as jobq.enqueue() announces (sender "sql").
        PERFORM pg_notify('jobq_wakeup', 'sql ' || w.n || ' ' || w.queue)
        FROM unnest(woken_queues, woken_counts) AS w(queue, n);
    END IF;

    -- The key's head ended (a waiting job leaving changes no turn, so the cascade's jobs
    -- change none): the next one's turn comes when no job of the key is open, and once its
    -- own parents (if any) have ended as it asks. No lock on the key's row here: a finish takes
    -- no lock beyond its own rows, so finishes and enqueues of several keys never wait for
    -- each other in opposite orders. An enqueue committing while this runs may add a waiting
    -- job this does not see; the enqueue's own check after its commit (ordering_key_unstick)
    -- and the promoter's sweep make it due.
    IF j.ordering_key IS NOT NULL AND (TG_OP = 'DELETE' OR OLD.status <> 'waiting') THEN
        IF NOT EXISTS (SELECT 1 FROM __S__.jobs
                       WHERE queue = j.queue AND ordering_key = j.ordering_key
                         AND status IN ('scheduled', 'pending', 'running')) THEN
            UPDATE __S__.jobs c
            SET status = CASE WHEN c.run_at > now() THEN 'scheduled' ELSE 'pending' END,
                updated_at = now()
            WHERE c.id = (SELECT n.id FROM __S__.jobs n
                          WHERE n.queue = j.queue AND n.ordering_key = j.ordering_key
                            AND n.status = 'waiting'
                          ORDER BY n.id LIMIT 1
                          FOR NO KEY UPDATE)
              AND c.status = 'waiting'
              AND (c.depends_on IS NULL OR NOT EXISTS (
                  SELECT 1
                  FROM generate_subscripts(c.depends_on, 1, true) AS s(i)
                  CROSS JOIN LATERAL (SELECT p.status FROM __S__.jobs p
                                      WHERE p.id = c.depends_on[s.i]) p
                  WHERE p.status <> 'succeeded'
                    AND NOT (c.on_parent_failure = 'run' AND p.status IN ('dead', 'cancelled'))))
            RETURNING c.id, c.queue, c.status INTO moved;
            IF FOUND THEN
                PERFORM __S__.jobq_linked_ready(moved.id, moved.queue, moved.status, j.id);
            END IF;
        END IF;
    END IF;
    RETURN NULL;
END $function$;

-- trigger: jobs_linked_inserted
-- Row-level, before INSERT, only for rows with depends_on or an ordering_key.
CREATE TRIGGER jobs_linked_inserted BEFORE INSERT ON __S__.jobs FOR EACH ROW WHEN (((new.depends_on IS NOT NULL) OR (new.ordering_key IS NOT NULL))) EXECUTE FUNCTION jobq_linked_inserted();

-- trigger: jobs_linked_reopened
-- Row-level, before an UPDATE of status that takes a finished job with an ordering_key back to an
-- open state.
CREATE TRIGGER jobs_linked_reopened BEFORE UPDATE OF status ON __S__.jobs FOR EACH ROW WHEN (((new.ordering_key IS NOT NULL) AND (old.status = ANY (ARRAY['succeeded'::text, 'dead'::text, 'cancelled'::text])) AND (new.status <> ALL (ARRAY['succeeded'::text, 'dead'::text, 'cancelled'::text])))) EXECUTE FUNCTION jobq_linked_reopened();

-- trigger: jobs_linked_settled
-- Row-level, after an UPDATE of status that ends a job with dependents or an ordering_key.
CREATE TRIGGER jobs_linked_settled AFTER UPDATE OF status ON __S__.jobs FOR EACH ROW WHEN (((new.has_dependents OR (new.ordering_key IS NOT NULL)) AND (new.status = ANY (ARRAY['succeeded'::text, 'dead'::text, 'cancelled'::text])) AND (old.status <> ALL (ARRAY['succeeded'::text, 'dead'::text, 'cancelled'::text])))) EXECUTE FUNCTION jobq_linked_settled();

-- trigger: jobs_linked_deleted
-- Row-level, after a DELETE of an unfinished job with dependents or an ordering_key (it counts as
-- cancelled).
CREATE TRIGGER jobs_linked_deleted AFTER DELETE ON __S__.jobs FOR EACH ROW WHEN (((old.has_dependents OR (old.ordering_key IS NOT NULL)) AND (old.status <> ALL (ARRAY['succeeded'::text, 'dead'::text, 'cancelled'::text])))) EXECUTE FUNCTION jobq_linked_settled();
