#!/usr/bin/env bash
# Services the test suite needs beyond git, sqlite MLflow stores, DVC and torch (all in .venv):
# headless Chromium + chromedriver for the `cascade ui` browser test. Installed from Debian's
# packages when missing and this runs as root (CI); elsewhere the browser test skips and says why.
set -uo pipefail
if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then
  exit 0
fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "services: installing chromium and chromium-driver (Debian packages) for the UI test"
  export DEBIAN_FRONTEND=noninteractive
  if ! apt-get install -y -q chromium chromium-driver >/tmp/cascade-apt.log 2>&1; then
    apt-get update -q >/tmp/cascade-apt-update.log 2>&1
    apt-get install -y -q chromium chromium-driver >/tmp/cascade-apt.log 2>&1 \
      || { echo "services: chromium could not be installed (see /tmp/cascade-apt.log)"; exit 0; }
  fi
else
  echo "services: no chromium; the browser test will skip (install chromium and chromium-driver)"
fi
