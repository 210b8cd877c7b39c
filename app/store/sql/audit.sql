-- Named statements for the audit trail (audit_log). Ops statements that change a job or a
-- queue record themselves in the same statement; these are for the actions that do not.
-- The audit listing is a builder (app/store/listing.py), not named SQL.

-- name: audit_insert
-- Records one admin action in audit_log, at the transaction's now(); for actions whose own statement does not (job_cancel).
INSERT INTO audit_log (actor, actor_key_id, action, outcome, queue, job_id, state_before, state_after,
                       detail)
VALUES (CAST(:actor AS text), CAST(:actor_key_id AS bigint), CAST(:action AS text),
        CAST(:outcome AS text), CAST(:queue AS text), CAST(:job_id AS bigint),
        CAST(:state_before AS text), CAST(:state_after AS text), CAST(:detail AS jsonb));

-- name: audit_insert_key
-- Records one key operation (create, revoke) in audit_log under the key's name, at the transaction's now().
INSERT INTO audit_log (actor, action, outcome, key_name, state_before, state_after, detail)
VALUES (CAST(:actor AS text), CAST(:action AS text), CAST(:outcome AS text),
        CAST(:key_name AS text), CAST(:state_before AS text), CAST(:state_after AS text),
        CAST(:detail AS jsonb));
