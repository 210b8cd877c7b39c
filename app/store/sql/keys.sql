-- Named statements for API keys (the api_keys table); app/store/keys.py (KeyStore) is the only
-- caller. A key's secret is never stored, only its SHA-256 (secret_sha256). Creating or revoking
-- a key also notifies jobq_keys (key_notify) in the same transaction, so every instance reloads
-- its cache when the change commits.

-- name: key_next_id
-- Reserves the next key id, which the secret embeds (so the secret is made before the insert).
SELECT nextval(pg_get_serial_sequence('api_keys', 'id')) AS id;

-- name: key_insert
-- Stores a new key under a reserved id; a taken name raises the unique violation (23505).
INSERT INTO api_keys (id, name, role, queues, secret_sha256) OVERRIDING SYSTEM VALUE
VALUES (:id, :name, :role, :queues, :digest);

-- name: key_revoke
-- Revokes the live key of a name; answers its id, no row when there was no live key.
UPDATE api_keys SET revoked_at = now()
WHERE name = :name AND revoked_at IS NULL
RETURNING id;

-- name: key_list
-- Every key, revoked ones included, oldest first (never the secret's hash).
SELECT id, name, role, queues, created_at, revoked_at
FROM api_keys
ORDER BY id;

-- name: key_live
-- The keys not revoked, with their secrets' hashes (the key cache's load).
SELECT id, name, role, queues, secret_sha256
FROM api_keys
WHERE revoked_at IS NULL;

-- name: key_by_digest
-- The live key whose secret has this hash, if any.
SELECT id, name, role, queues
FROM api_keys
WHERE secret_sha256 = :digest AND revoked_at IS NULL;

-- name: key_any
-- Whether any key was ever made (revoked ones count).
SELECT EXISTS (SELECT 1 FROM api_keys) AS any_key;

-- name: key_notify
-- Tells every instance (LISTEN jobq_keys) to reload its key cache when this transaction commits.
SELECT pg_notify(CAST(:channel AS text), '');
