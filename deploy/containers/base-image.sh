#!/usr/bin/env bash
# Makes the base image the Stoker image builds on, without a registry:
# debootstrap a minimal Debian 12 (bookworm) root file system from the same
# mirror apt uses on this machine, and import it into podman as
# localhost/stoker-base:bookworm. Skips the work when that image exists
# (STOKER_REBUILD_BASE=1 forces it). With a registry, skip this script and
# build with --build-arg BASE=docker.io/library/debian:bookworm-slim instead.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/podman-env.sh"
image=${STOKER_BASE_IMAGE:-localhost/stoker-base:bookworm}

if [ -z "${STOKER_REBUILD_BASE:-}" ] && podman image exists "$image"; then
  echo "base-image: $image present"
  exit 0
fi
command -v debootstrap >/dev/null || {
  echo "base-image: debootstrap is missing (apt-get install debootstrap)" >&2
  exit 1
}

# The mirror apt already uses (deb822 or one-line sources), else Debian's CDN.
mirror=$(grep -hsE '^URIs:' /etc/apt/sources.list.d/*.sources | awk '{print $2}' |
  grep -v security | head -1 || true)
[ -n "$mirror" ] || mirror=$(grep -hsE '^deb ' /etc/apt/sources.list | awk '{print $2}' | head -1 || true)
mirror=${mirror:-http://deb.debian.org/debian}

rootfs=$(mktemp -d -t stoker-rootfs.XXXXXX)
trap 'rm -rf "$rootfs"' EXIT
echo "base-image: debootstrap bookworm from $mirror"
debootstrap --variant=minbase bookworm "$rootfs" "$mirror" >"$rootfs.log" 2>&1 || {
  tail -20 "$rootfs.log" >&2
  exit 1
}
rm -f "$rootfs.log"
cat >"$rootfs/etc/apt/sources.list" <<SOURCES
deb $mirror bookworm main
deb $mirror bookworm-updates main
deb ${mirror%/debian}/debian-security bookworm-security main
SOURCES
# As in Debian's slim images: no package caches, docs or man pages kept.
rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
cat >"$rootfs/etc/dpkg/dpkg.cfg.d/01-slim" <<'SLIM'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
SLIM
tar -C "$rootfs" -c . | podman import --change 'CMD ["/bin/bash"]' - "$image" >/dev/null
echo "base-image: imported $image"
