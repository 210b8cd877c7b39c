-- Awaiting a job's result (GET /v1/jobs/{id}?wait_seconds=); see app/queue/results.py.
-- A row trigger (migration 0012) sends pg_notify('jobq_finished', id) when a job whose
-- awaited is true finishes or is deleted; nothing else ever pays for a NOTIFY.

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
