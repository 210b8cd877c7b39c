#!/bin/sh
# The compose stack's one-shot `keys` service: makes the first API keys, once.
#
# With no key in the database it makes an admin key (compose-admin), printed here once, and a
# worker key (compose-worker) for the example worker; both are kept in the `keys` volume
# (/var/lib/jobq/*.key, mode 600, readable by the jobq user only). Once keys exist it changes
# nothing, except that it makes a fresh worker key when the volume lost worker.key. Read the
# admin key later with: docker compose run --rm --entrypoint cat keys /var/lib/jobq/admin.key
set -eu
umask 077
dir="${JOBQ_KEYS_DIR:-/var/lib/jobq}"

if [ -z "$(jobq keys list | tail -n +2)" ]; then
    jobq keys create --role admin --name compose-admin >"$dir/admin.key"
    jobq keys create --role worker --name compose-worker >"$dir/worker.key"
    echo "keys: made the admin key compose-admin (shown once; also in the keys volume):"
    cat "$dir/admin.key"
elif [ ! -s "$dir/worker.key" ]; then
    name="compose-worker-$(date +%Y%m%d%H%M%S)"
    jobq keys create --role worker --name "$name" >"$dir/worker.key"
    echo "keys: the database has keys; made worker key $name for the example worker"
else
    echo "keys: the database has keys and the worker has its key; nothing to do"
fi
