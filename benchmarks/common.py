"""Shared by the benchmarks: a scratch git repository and small statistics helpers."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from cascade_repro.store.ui_server import server_environment

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


def timed(argv: list[str], cwd: object, expect: int = 0) -> tuple[float, str]:
    """Wall time and stdout of a command started as a user starts it; it must exit `expect`."""
    started = time.perf_counter()
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, env=clean_env())
    elapsed = time.perf_counter() - started
    if done.returncode != expect:
        shown = " ".join(argv[2:] if argv[:3] == CASCADE else argv)
        sys.exit(f"{shown} exited {done.returncode}, expected {expect}:\n{done.stderr[-4000:]}")
    return elapsed, done.stdout


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "CASCADE_"))}


def median(values: list[float]) -> float:
    return statistics.median(values)


def verdict(ratio: float, target: float, lower_is_better: bool = True) -> str:
    ok = ratio <= target if lower_is_better else ratio >= target
    return "meets target" if ok else "MISSES target"


def start_server(workdir: Path) -> tuple[str, subprocess.Popen[bytes]]:
    """`mlflow server` on sqlite with proxied artifacts, once it answers /health."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
    log = (workdir / "server.log").open("wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", f"sqlite:///{workdir}/server.db",
         "--serve-artifacts", "--artifacts-destination", str(workdir / "artifacts"),
         "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        env=server_environment(dict(os.environ)),  # as `cascade ui` starts it: no job workers
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        try:
            with urllib.request.urlopen(url + "/health", timeout=2):
                return url, process
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                stop_server(process)
                sys.exit(f"mlflow server did not start: see {workdir / 'server.log'}")
            time.sleep(0.5)


def stop_server(process: subprocess.Popen[bytes]) -> None:
    """Stop `mlflow server` and what it started (uvicorn, the job runner, huey consumers).

    They share the session start_server opened, so the whole process group is signalled: the parent
    forwards SIGTERM to uvicorn only, and a SIGKILL to it alone would leave its children serving.
    """
    group = process.pid
    try:
        os.killpg(group, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(group, signal.SIGKILL)
        process.wait()
    # the children may outlive the parent for a moment; signal 0 only asks whether any is left
    deadline = time.monotonic() + 10
    while True:
        try:
            os.killpg(group, 0)
        except ProcessLookupError:
            return
        if time.monotonic() > deadline:
            os.killpg(group, signal.SIGKILL)
            return
        time.sleep(0.1)
