#!/usr/bin/env bash
# Services the test suite needs beyond git, sqlite MLflow stores, DVC and torch (all in .venv):
#   - headless Chromium + chromedriver for the `cascade ui` browser test;
#   - a Docker engine (Debian's docker.io, dockerd started here) and the local base image the Docker
#     suite builds on (scripts/docker_base.sh: no image registry is reachable);
#   - PostgreSQL's server binaries and an OpenSSH server for the team-scale suite (tests/server
#     starts its own cluster, MLflow tracking servers and sshd, and stops them).
# Installed from Debian's packages when missing and this runs as root (CI); elsewhere the suites
# that need them skip and say why.
set -uo pipefail
export DEBIAN_FRONTEND=noninteractive
root_with_apt() { [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; }
apt_install() {  # apt_install LOG PACKAGE...
  local log="$1"; shift
  apt-get install -y -q "$@" >"$log" 2>&1 && return 0
  apt-get update -q >/tmp/cascade-apt-update.log 2>&1
  apt-get install -y -q "$@" >"$log" 2>&1
}

# --- Chromium ---------------------------------------------------------------------------------
if ! { command -v chromium >/dev/null && command -v chromedriver >/dev/null; }; then
  if root_with_apt; then
    echo "services: installing chromium and chromium-driver (Debian packages) for the UI test"
    apt_install /tmp/cascade-apt.log chromium chromium-driver \
      || echo "services: chromium could not be installed (see /tmp/cascade-apt.log)"
  else
    echo "services: no chromium; the browser test will skip (install chromium and chromium-driver)"
  fi
fi

# --- PostgreSQL ------------------------------------------------------------------------------
if ! { command -v initdb >/dev/null || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; }; then
  if root_with_apt; then
    echo "services: installing postgresql (Debian package) for the team-scale suite"
    apt_install /tmp/cascade-apt-postgresql.log postgresql \
      || echo "services: postgresql could not be installed (see /tmp/cascade-apt-postgresql.log)"
  else
    echo "services: no PostgreSQL; its tests will skip (install postgresql)"
  fi
fi

# --- OpenSSH server (a DVC remote over SSH; the suite starts its own sshd on a free port) --------
if [ ! -x /usr/sbin/sshd ] && root_with_apt; then
  echo "services: installing openssh-server (Debian package) for the SSH remote test"
  apt_install /tmp/cascade-apt-ssh.log openssh-server \
    || echo "services: openssh-server could not be installed (see /tmp/cascade-apt-ssh.log)"
fi

# --- Docker engine ----------------------------------------------------------------------------
if ! docker info >/dev/null 2>&1; then
  if ! command -v dockerd >/dev/null && root_with_apt; then
    echo "services: installing docker.io (Debian package) for the Docker suite"
    apt_install /tmp/cascade-apt-docker.log docker.io \
      || echo "services: docker.io could not be installed (see /tmp/cascade-apt-docker.log)"
  fi
  # the package may have started one already
  if ! docker info >/dev/null 2>&1 && command -v dockerd >/dev/null && [ "$(id -u)" = 0 ]; then
    echo "services: starting dockerd (log: /tmp/cascade-dockerd.log)"
    nohup dockerd >/tmp/cascade-dockerd.log 2>&1 &
    for _ in $(seq 1 120); do docker info >/dev/null 2>&1 && break; sleep 0.5; done
  fi
fi
if ! command -v debootstrap >/dev/null && root_with_apt; then  # scripts/docker_base.sh needs it
  apt_install /tmp/cascade-apt-debootstrap.log debootstrap \
    || echo "services: debootstrap could not be installed (see /tmp/cascade-apt-debootstrap.log)"
fi
if docker info >/dev/null 2>&1; then
  bash "$(dirname "$0")/docker_base.sh" || echo "services: no base image; the Docker suite will say why"
else
  echo "services: no Docker engine; the Docker suite will skip (see /tmp/cascade-dockerd.log)"
fi
exit 0
