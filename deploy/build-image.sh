#!/usr/bin/env bash
# Builds jobq's image with podman on this kind of machine: the base from deploy/build-base.sh,
# no registry (--pull=never), the host's network, and the host's package-index settings for the
# build only: its CA bundle mounted read-only, PIP_INDEX_URL / PIP_EXTRA_INDEX_URL /
# PIP_FIND_LINKS passed through when set, and a pip cache under the cache folder. None of it is
# baked into the image.
#
#   deploy/build-image.sh [TAG]      # default jobq:latest; extra podman build flags via
#                                    # JOBQ_BUILD_FLAGS (e.g. --no-cache)
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="$(dirname "$here")"
# Absolute: podman's copier subprocess runs in another directory.
export CONTAINERS_CONF="$(realpath "${CONTAINERS_CONF:-$here/containers.conf}")"
cache="${JOBQ_IMAGE_CACHE:-${HOME}/.cache/jobq-image}"
tag="${1:-jobq:latest}"

"$here/build-base.sh"

args=(--format docker --pull=never --network host --layers)
ca="${PIP_CERT:-${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}}"
if [[ -s "$ca" ]]; then
    args+=(-v "$ca:/run/build/ca.crt:ro" --build-arg PIP_CERT=/run/build/ca.crt)
fi
mkdir -p "$cache/pip"
args+=(-v "$cache/pip:/run/build/pip-cache" --build-arg PIP_CACHE_DIR=/run/build/pip-cache)
for name in PIP_INDEX_URL PIP_EXTRA_INDEX_URL PIP_FIND_LINKS; do
    # Only indexes the build can reach: a file:// index or a local folder is on the host's disk.
    value="${!name:-}"
    if [[ -n "$value" && "$value" != file://* && "$value" != /* ]]; then
        args+=(--build-arg "$name=$value")
    fi
done
# The builder and runtime stages first, tagged, so that they stay as the next build's cache
# when the image is removed; then the image. Those stages of older builds, untagged now, are
# removed (only those: by their label).
for stage in builder runtime; do
    # shellcheck disable=SC2086
    podman build "${args[@]}" --target "$stage" -t "jobq-$stage:cache" ${JOBQ_BUILD_FLAGS:-} "$root"
done
# Seen once here (2026-12-08, CI): podman's check of its layer cache failed with "getting top
# layer info: layer not known" after an earlier build's prune, and the same build passed when run
# again. Only that error is retried, once; any other failure stands.
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
# shellcheck disable=SC2086
if ! podman build "${args[@]}" -t "$tag" ${JOBQ_BUILD_FLAGS:-} "$root" 2> >(tee "$log" >&2); then
    wait
    grep -q "layer not known" "$log" || exit 1
    echo "build-image.sh: podman lost a cached layer; building once more" >&2
    # shellcheck disable=SC2086
    podman build "${args[@]}" -t "$tag" ${JOBQ_BUILD_FLAGS:-} "$root"
fi
for stage in builder runtime; do
    podman image prune --force --filter "label=io.jobq.stage=$stage" >/dev/null
done
