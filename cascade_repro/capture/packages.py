"""Installed Python packages {name: version, origin} read straight from sys.path, without pip.

`pip freeze` spawns an interpreter and parses every METADATA file (~0.4 s). The name and version are
already in each `.dist-info` directory name, and the origin (editable, VCS or local URL) in its
`direct_url.json`, so one directory listing per sys.path entry is enough.
"""

from __future__ import annotations

import json
import os
import platform
import re
import sys
from typing import Any, Iterable

_NORMALIZE = re.compile(r"[-_.]+")


def normalize(name: str) -> str:
    return _NORMALIZE.sub("-", name).lower()


def installable(name: str, version: object) -> bool:
    """Whether a recorded distribution can be pinned: not pip's leftover (`~orch`, in records made
    before capture skipped them) and with a version (an egg-info may have none)."""
    return not name.startswith("~") and bool(version)


def capture_python(paths: Iterable[str] | None = None) -> dict[str, Any]:
    return {
        "version": platform.python_version(),
        "implementation": platform.python_implementation(),
        "executable": sys.executable,
        "prefix": sys.prefix,
        "in_venv": sys.prefix != sys.base_prefix,
        "packages": capture_packages(paths),
    }


def capture_packages(paths: Iterable[str] | None = None) -> dict[str, dict[str, Any]]:
    packages: dict[str, dict[str, Any]] = {}
    for entry in sys.path if paths is None else paths:
        try:
            names = os.listdir(entry or ".")
        except OSError:
            continue
        for name in names:
            if name.startswith("~"):  # what pip renames aside while it uninstalls: not installed
                continue
            if name.endswith(".dist-info"):
                parsed = _from_dist_info(entry, name)
            elif name.endswith(".egg-info"):
                parsed = _from_egg_info(entry, name)
            else:
                continue
            if parsed and parsed[0] not in packages:  # first on sys.path wins, as for imports
                packages[parsed[0]] = parsed[1]
    return dict(sorted(packages.items()))


def _from_dist_info(entry: str, dirname: str) -> tuple[str, dict[str, Any]] | None:
    stem = dirname[: -len(".dist-info")]
    name, sep, version = stem.partition("-")
    if not sep:
        return None
    info: dict[str, Any] = {"version": version}
    direct = os.path.join(entry, dirname, "direct_url.json")
    if os.path.exists(direct):
        info.update(_origin(direct))
    return normalize(name), info


def _from_egg_info(entry: str, dirname: str) -> tuple[str, dict[str, Any]] | None:
    stem = dirname[: -len(".egg-info")]
    parts = stem.split("-")
    version = parts[1] if len(parts) > 1 else _pkg_info_version(os.path.join(entry, dirname))
    if version is None:
        return None
    return normalize(parts[0]), {"version": version, "origin": "egg-info"}


def _pkg_info_version(path: str) -> str | None:
    target = os.path.join(path, "PKG-INFO") if os.path.isdir(path) else path
    try:
        with open(target, encoding="utf-8", errors="replace") as handle:
            for line in handle:
                if line.startswith("Version:"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        return None
    return None


def _origin(path: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, ValueError):
        return {}
    url = str(data.get("url", ""))
    if data.get("dir_info", {}).get("editable"):
        return {"origin": "editable", "url": url}
    if "vcs_info" in data:
        vcs = data["vcs_info"]
        return {"origin": vcs.get("vcs", "vcs"), "url": url, "commit": vcs.get("commit_id")}
    if "archive_info" in data:
        return {"origin": "archive", "url": url}
    return {"origin": "direct", "url": url}


def installed_version(name: str) -> str | None:
    """The installed version of a distribution, without importing it (None: not installed)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None
