"""Everything `cascade run` captures about the work tree and the machine, in one call (a thread of
the parent runs it while the script starts)."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, Iterable, Mapping

from cascade_repro.capture import earlier_outputs
from cascade_repro.capture.data import capture_data
from cascade_repro.capture.environment import capture_environment
from cascade_repro.capture.git import GitState, capture_git
from cascade_repro.capture.packages import capture_python
from cascade_repro.capture.system import capture_system

log = logging.getLogger(__name__)


def capture_snapshot(root: Path, exclude: tuple[str, ...], untracked_max_bytes: int, env: Mapping[str, str],
                     env_allow_prefixes: Iterable[str],
                     python_here: bool = True, keep: Path | None = None) -> dict[str, Any]:  # fmt: skip
    """`python_here=False`: the script runs elsewhere (a container), whose Python the caller reads.
    `keep`: where the untracked files are copied, from the read that hashes them. Files earlier runs
    of this checkout wrote, unchanged since, are left out of the dirty state (earlier_outputs.py)."""
    started = time.perf_counter()
    git = capture_git(root, exclude, untracked_max_bytes, keep, earlier_outputs.load(root))
    python = capture_python() if python_here else {"packages": {}}
    system = capture_system(env)
    environment = capture_environment(env, env_allow_prefixes)
    try:
        data = capture_data(root)
    except Exception as exc:  # the run goes on; the record says why its data section is empty
        log.warning("DVC-tracked data not recorded: %s", exc)
        data = []
    for item in git.untracked:
        log.debug("untracked %s: %d bytes, %s", item.path, item.size, "kept" if item.stored else item.reason)
    for earlier in git.earlier_outputs:
        log.debug("left out %s: %d bytes, written by run %s", earlier.path, earlier.size, earlier.run_id)
    log.debug(
        "captured in %.0f ms: commit %s (%s), %d packages, %d env vars, %d untracked files, %d DVC outputs",
        (time.perf_counter() - started) * 1000, git.commit[:12], "dirty" if git.dirty else "clean",
        len(python["packages"]), len(environment), len(git.untracked), len(data),
    )  # fmt: skip
    return {"git": git, "python": python, "system": system, "environment": environment, "data": data}


def empty_snapshot() -> dict[str, Any]:
    """What the record holds when capture itself failed (the run is still closed with its outcome)."""
    unavailable = GitState("unavailable", None, {}, False, b"", ())
    return {"git": unavailable, "python": {}, "system": {"container": {}}, "environment": {}, "data": []}
