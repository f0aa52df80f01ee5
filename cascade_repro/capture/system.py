"""The machine: OS, CPU model and flags, memory, GPUs (via nvidia-smi, never CUDA), container."""

from __future__ import annotations

import os
import platform
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
    markers = [p for p in ("/.dockerenv", "/run/.containerenv") if os.path.exists(p)]
    try:
        cgroup = Path("/proc/1/cgroup").read_text(encoding="utf-8", errors="replace")
    except OSError:
        cgroup = ""
    runtimes = [r for r in ("docker", "kubepods", "containerd", "libpod", "lxc") if r in cgroup]
    return {
        "in_container": bool(markers or runtimes or environ.get("CASCADE_IMAGE")),
        "evidence": markers + runtimes,
        "image": environ.get("CASCADE_IMAGE"),
    }


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
