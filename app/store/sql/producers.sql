-- Named statements for producers that share jobq's database (migration 0019): the function
-- jobq.enqueue() they call inside their own transactions, and the bounds it checks.

-- name: enqueue_limits_set
-- Writes the bounds and defaults jobq.enqueue() applies (one row), as this instance's settings have them.
INSERT INTO jobq.enqueue_limits AS l (id, queue_name_max_chars, type_max_chars,
                                      idempotency_key_max_chars, concurrency_key_max_chars,
                                      payload_max_bytes, max_attempts_default,
                                      lease_seconds_default, updated_at)
VALUES (true, :queue_name_max_chars, :type_max_chars, :idempotency_key_max_chars,
        :concurrency_key_max_chars, :payload_max_bytes, :max_attempts_default,
        :lease_seconds_default, now())
ON CONFLICT (id) DO UPDATE
SET queue_name_max_chars = EXCLUDED.queue_name_max_chars,
    type_max_chars = EXCLUDED.type_max_chars,
    idempotency_key_max_chars = EXCLUDED.idempotency_key_max_chars,
    concurrency_key_max_chars = EXCLUDED.concurrency_key_max_chars,
    payload_max_bytes = EXCLUDED.payload_max_bytes,
    max_attempts_default = EXCLUDED.max_attempts_default,
    lease_seconds_default = EXCLUDED.lease_seconds_default,
    updated_at = now()
WHERE (l.queue_name_max_chars, l.type_max_chars, l.idempotency_key_max_chars,
       l.concurrency_key_max_chars, l.payload_max_bytes, l.max_attempts_default,
       l.lease_seconds_default)
      IS DISTINCT FROM
      (EXCLUDED.queue_name_max_chars, EXCLUDED.type_max_chars, EXCLUDED.idempotency_key_max_chars,
       EXCLUDED.concurrency_key_max_chars, EXCLUDED.payload_max_bytes,
       EXCLUDED.max_attempts_default, EXCLUDED.lease_seconds_default);
