"""Shared by the benchmarks: a scratch git repository and small statistics helpers."""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
CASCADE = [sys.executable, "-m", "cascade_repro.cli"]


def scratch_repo(files: dict[str, Path]) -> Path:
    """A committed git repo in a temp dir holding `files` ({name in repo: source path})."""
    root = Path(tempfile.mkdtemp(prefix="cascade-bench-"))
    for name, source in files.items():
        shutil.copyfile(source, root / name)
    (root / ".gitignore").write_text("mlflow.db\nmlruns/\n.cascade/\n*.json\n")
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "bench",
        "GIT_AUTHOR_EMAIL": "b@e",
        "GIT_COMMITTER_NAME": "bench",
        "GIT_COMMITTER_EMAIL": "b@e",
    }
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "bench"]):
        subprocess.run(["git", *args], cwd=root, check=True, env=env)
    return root


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "CASCADE_"))}


def median(values: list[float]) -> float:
    return statistics.median(values)


def verdict(ratio: float, target: float, lower_is_better: bool = True) -> str:
    ok = ratio <= target if lower_is_better else ratio >= target
    return "meets target" if ok else "MISSES target"
