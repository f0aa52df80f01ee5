"""What this machine can do for the suite: each capability's probe answers None (available) or the
reason a test needing it is skipped. Probed once per session, on first use."""

from __future__ import annotations

import functools
import glob
import os
import shutil
from typing import Callable


def _docker() -> str | None:
    try:
        import docker

        client = docker.from_env(timeout=30)
        client.ping()
        client.close()
    except Exception as exc:  # the SDK missing, no socket, an engine that does not answer
        return f"no Docker engine answers ({exc}); `make test` as root starts one (scripts/services.sh)"
    return None


def _chromium() -> str | None:
    if chromium_paths() is None:
        return "no Chromium + chromedriver on this machine (`make test` installs Debian's as root)"
    return None


def chromium_paths() -> tuple[str, str] | None:
    """(browser, driver) where both are installed."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    driver = shutil.which("chromedriver") or (
        "/usr/bin/chromedriver" if os.path.exists("/usr/bin/chromedriver") else None
    )
    return (browser, driver) if browser and driver else None


def _cuda() -> str | None:
    import torch

    if not torch.cuda.is_available():
        return "no CUDA device: torch.cuda.is_available() is False here"
    return None


def _postgres() -> str | None:
    if shutil.which("pg_ctl") or glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"):
        return None
    return "PostgreSQL is not installed (`make test` as root installs Debian's postgresql)"


def _sshd() -> str | None:
    if os.path.exists("/usr/sbin/sshd") and os.geteuid() == 0:
        return None
    return "no OpenSSH server, or not root to start one (`make test` as root installs openssh-server)"


def _root() -> str | None:
    return None if os.geteuid() == 0 else "needs root (it mounts a small tmpfs)"


CAPABILITIES: dict[str, tuple[str, Callable[[], str | None]]] = {
    "requires_docker": ("a Docker engine answers", _docker),
    "requires_chromium": ("Chromium and chromedriver are installed", _chromium),
    "requires_cuda": ("torch sees a CUDA device", _cuda),
    "requires_postgres": ("PostgreSQL's server binaries are installed", _postgres),
    "requires_root": ("the suite runs as root", _root),
    "requires_sshd": ("an OpenSSH server can be started (root)", _sshd),
}


@functools.cache
def missing(capability: str) -> str | None:
    """Why `capability` is unavailable here, or None."""
    return CAPABILITIES[capability][1]()
