#!/usr/bin/env bash
# Makes the image the Dockerfile starts FROM (debian:bookworm-slim) out of Debian's packages, for
# machines that reach Debian's archive but no container registry. The root filesystem is made
# once by debootstrap (about 45 s) and kept as a tarball in the cache folder; later runs only
# import that tarball into podman (a few seconds), and runs that find the image do nothing.
#
#   deploy/build-base.sh            # import from the cache, or build and cache first
#   deploy/build-base.sh --rebuild  # debootstrap again (e.g. for the archive's newer packages)
#
# Environment: JOBQ_IMAGE_CACHE (default ~/.cache/jobq-image), JOBQ_BASE_IMAGE (default
# debian:bookworm-slim), DEBIAN_MIRROR (default http://deb.debian.org/debian). Needs root,
# debootstrap and podman.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
# Absolute: podman's copier subprocess runs in another directory.
export CONTAINERS_CONF="$(realpath "${CONTAINERS_CONF:-$here/containers.conf}")"
cache="${JOBQ_IMAGE_CACHE:-${HOME}/.cache/jobq-image}"
image="${JOBQ_BASE_IMAGE:-debian:bookworm-slim}"
mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
tarball="$cache/debian-bookworm-slim.tar"
rebuild=false
[[ "${1:-}" == "--rebuild" ]] && rebuild=true

if ! $rebuild && podman image exists "$image"; then
    echo "build-base: $image is in podman's storage already"
    exit 0
fi

if $rebuild || [[ ! -s "$tarball" ]]; then
    mkdir -p "$cache"
    work="$(mktemp -d "$cache/rootfs.XXXXXX")"
    trap 'rm -rf "$work"' EXIT
    echo "build-base: debootstrap --variant=minbase bookworm (about 45 s)"
    debootstrap --variant=minbase bookworm "$work/rootfs" "$mirror" >"$work/debootstrap.log" 2>&1 ||
        { tail -n 30 "$work/debootstrap.log" >&2; exit 1; }
    rootfs="$work/rootfs"
    # What Docker's debian:bookworm-slim has and minbase lacks: the updates and security suites,
    # and apt set up not to keep what images do not need.
    rm -f "$rootfs/etc/apt/sources.list"
    cat >"$rootfs/etc/apt/sources.list.d/debian.sources" <<EOF
Types: deb
URIs: $mirror
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
    cat >"$rootfs/etc/apt/apt.conf.d/docker-clean" <<'EOF'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
EOF
    cat >"$rootfs/etc/dpkg/dpkg.cfg.d/docker" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
EOF
    echo 'APT::Install-Recommends "false";' >"$rootfs/etc/apt/apt.conf.d/docker-no-recommends"
    rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/* "$rootfs"/var/log/*.log \
        "$rootfs"/usr/share/man/* "$rootfs"/usr/share/info/* "$rootfs"/usr/share/locale/*
    find "$rootfs/usr/share/doc" -mindepth 2 ! -name copyright -delete 2>/dev/null || true
    tar --numeric-owner -C "$rootfs" -cf "$tarball.part" .
    mv "$tarball.part" "$tarball"
    echo "build-base: cached $tarball ($(du -h "$tarball" | cut -f1))"
fi

podman import --quiet --change 'CMD ["bash"]' "$tarball" "$image" >/dev/null
echo "build-base: imported $image from $tarball"
