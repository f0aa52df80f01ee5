#!/usr/bin/env bash
# Build the local base image the Docker tests use: no image registry is reachable here, so a Debian
# root with Python 3.11 (venv + pip) is made with debootstrap and loaded with `docker import`.
# Cached by tag: a second call with the image present does nothing.
#   usage: scripts/docker_base.sh [TAG]     (default cascade-test/python:3.11-bookworm)
set -euo pipefail
TAG="${1:-cascade-test/python:3.11-bookworm}"
if docker image inspect "$TAG" >/dev/null 2>&1; then
  echo "docker base: $TAG present"
  exit 0
fi
if ! command -v debootstrap >/dev/null; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q debootstrap >/tmp/cascade-apt-debootstrap.log 2>&1
fi
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
root="$(mktemp -d /tmp/cascade-base.XXXXXX)"
trap 'rm -rf "$root"' EXIT
echo "docker base: debootstrap bookworm into $root (a few minutes)"
debootstrap --variant=minbase --include=python3,python3-venv,python3-pip,ca-certificates \
  bookworm "$root" "$MIRROR" >/tmp/cascade-debootstrap.log 2>&1 \
  || { echo "docker base: debootstrap failed, see /tmp/cascade-debootstrap.log"; exit 1; }
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
tar -C "$root" -c . | docker import \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV LANG=C.UTF-8' \
  --change 'CMD ["python3"]' - "$TAG" >/dev/null
echo "docker base: imported $TAG ($(docker image inspect -f '{{.Size}}' "$TAG") bytes)"
