"""The machine: OS, CPU model and flags, memory, GPUs (via nvidia-smi, never CUDA), container."""

from __future__ import annotations

import os
import platform
import re
import shutil
import socket
import subprocess
from pathlib import Path
from typing import Any, Mapping


def capture_system(environ: Mapping[str, str]) -> dict[str, Any]:
    return {
        "os": {
            "system": platform.system(),
            "release": platform.release(),
            "version": platform.version(),
            "machine": platform.machine(),
            "libc": "-".join(platform.libc_ver()),
        },
        "hostname": socket.gethostname(),
        "cpu": capture_cpu(),
        "memory_mb": _memory_mb(),
        "gpus": capture_gpus(),
        "container": capture_container(environ),
    }


def capture_cpu() -> dict[str, Any]:
    info: dict[str, Any] = {"count": os.cpu_count(), "model": platform.processor() or None, "flags": []}
    try:
        affinity = len(os.sched_getaffinity(0))
        info["usable"] = affinity
    except (AttributeError, OSError):
        pass
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return info
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and not info.get("model_name"):
            info["model"] = value.strip()
        elif key in ("flags", "Features") and not info["flags"]:
            info["flags"] = sorted(value.split())
    return info


def capture_gpus() -> list[dict[str, Any]] | str:
    """GPUs as the driver sees them; never initializes CUDA in this process."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    fields = "index,name,uuid,memory.total,driver_version,compute_cap"
    try:
        out = subprocess.run(
            [smi, f"--query-gpu={fields}", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=10, check=False,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unavailable: {type(exc).__name__}"
    if out.returncode != 0:
        return f"unavailable: nvidia-smi exit {out.returncode}"
    gpus = []
    for line in out.stdout.strip().splitlines():
        values = [v.strip() for v in line.split(",")]
        if len(values) == 6:
            index, name, uuid, memory, driver, capability = values
            gpus.append(
                {
                    "index": int(index), "name": name, "uuid": uuid, "memory_mb": _number(memory),
                    "driver": driver, "compute_capability": capability,
                }
            )  # fmt: skip
    return gpus


def capture_container(environ: Mapping[str, str]) -> dict[str, Any]:
    """Whether this process runs in a container, and which image: what `CASCADE_IMAGE` (and
    `CASCADE_IMAGE_ID`) say, for containers started elsewhere (Kubernetes, a shell), plus the
    container's ID where the runtime exposes it."""
    markers = [p for p in ("/.dockerenv", "/run/.containerenv") if os.path.exists(p)]
    try:
        cgroup = Path("/proc/1/cgroup").read_text(encoding="utf-8", errors="replace")
    except OSError:
        cgroup = ""
    runtimes = [r for r in ("docker", "kubepods", "containerd", "libpod", "lxc") if r in cgroup]
    image = environ.get("CASCADE_IMAGE") or None
    found: dict[str, Any] = {
        "in_container": bool(markers or runtimes or image),
        "evidence": markers + runtimes,
        "image": image,
    }
    if environ.get("CASCADE_IMAGE_ID"):
        found["image_id"] = environ["CASCADE_IMAGE_ID"]
    if image and "@sha256:" in image:
        found["repo_digest"] = image
    container_id = _container_id(cgroup) if found["in_container"] else None
    if container_id:
        found["container_id"] = container_id
    return found


_CONTAINER_ID = re.compile(r"(?:docker[-/]|containers/|cri-containerd-|libpod-)([0-9a-f]{64})")


def _container_id(cgroup: str) -> str | None:
    """The 64-hex container ID from cgroup v1 paths, or from the mounts of /etc/hostname (cgroup v2)."""
    try:
        mounts = Path("/proc/self/mountinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        mounts = ""
    for text in (cgroup, mounts):
        match = _CONTAINER_ID.search(text)
        if match:
            return match.group(1)
    return None


def _memory_mb() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) // 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _number(text: str) -> float | str:
    try:
        return float(text)
    except ValueError:
        return text
