"""What the fault tests share: a `cascade run` in the background, waiting for markers, counting points,
a small filesystem of their own."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from tests.plugin import CASCADE, SCRIPTS, Project


@contextlib.contextmanager
def small_tmpfs(mount: Path, size: str) -> Iterator[Path]:
    """`mount` (created) on a tmpfs of `size` ("96k", "64m") for the block: a real ENOSPC, not a mock.
    Root only; where mounting is not allowed the test is skipped and says why."""
    mount.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)],
                          capture_output=True, text=True)  # fmt: skip
    if done.returncode != 0:
        pytest.skip(f"a small filesystem cannot be mounted here: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def add_faults_script(project: Project) -> None:
    project.write("faults.py", (SCRIPTS / "faults.py").read_text())
    project.commit("faults script")


class Background:
    """`cascade run ARGS` as a real process in its own session; its stderr is read as it comes."""

    def __init__(self, project: Project, *args: str, env: dict[str, str] | None = None) -> None:
        self.project = project
        self.process = subprocess.Popen(
            [*CASCADE, "run", *args], cwd=project.root, env={**os.environ, **(env or {})},
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        )  # fmt: skip
        self.stderr: list[str] = []
        self.stdout: list[str] = []
        self._readers = [
            threading.Thread(target=self._read, args=(self.process.stderr, self.stderr), daemon=True),
            threading.Thread(target=self._read, args=(self.process.stdout, self.stdout), daemon=True),
        ]
        for reader in self._readers:
            reader.start()

    @staticmethod
    def _read(stream: Any, sink: list[str]) -> None:
        for line in stream:
            sink.append(line)

    def said(self, text: str) -> bool:
        return any(text in line for line in list(self.stderr))

    def wait_for(self, condition: Callable[[], bool], what: str, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            if self.process.poll() is not None:
                raise AssertionError(
                    f"cascade exited {self.process.returncode} before {what}:\n{self.output()}"
                )
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}:\n{self.output()}")
            time.sleep(0.02)

    def kill(self) -> None:
        os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=30)

    def finish(self, timeout: float = 300) -> int:
        code = self.process.wait(timeout=timeout)
        for reader in self._readers:
            reader.join(timeout=10)
        return code

    def output(self) -> str:
        return "".join(self.stderr)

    def run_dir(self) -> Path | None:
        runs = self.project.root / ".cascade" / "runs"
        found = (
            [p for p in runs.iterdir() if p.is_dir() and not p.name.startswith(".")] if runs.is_dir() else []
        )
        return found[0] if len(found) == 1 else None


def marker(project: Project, name: str) -> Path:
    return project.root / "out" / name


def process_gone(pid: int, timeout: float = 30) -> bool:
    """Whether process `pid` ends (or is a zombie) within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.05)
    return False


def points_in(events: Path) -> dict[str, int]:
    """Points per key in a run directory's events.jsonl (what the script flushed to disk)."""
    counts: dict[str, int] = {}
    if not events.exists():
        return counts
    for line in events.read_text().splitlines():
        if line.strip():
            _, _, values = json.loads(line)
            for key in values:
                counts[key] = counts.get(key, 0) + 1
    return counts


def stored_points(project: Project, run_id: str, keys: list[str], client: Any = None) -> dict[str, int]:
    client = client or project.client()
    return {key: len(client.get_metric_history(run_id, key)) for key in keys}


def statuses(project: Project) -> list[str]:
    return sorted(r.info.status for r in project.runs())
