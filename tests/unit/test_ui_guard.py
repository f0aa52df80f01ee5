"""store/ui_guard.py: a `cascade ui` that ends, even by SIGKILL, takes its server's whole process group
down, also a process the server started and would not stop itself (older MLflow versions' uvicorn)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.faults.helpers import process_gone

# a "server" that leaves its own child behind when it dies of SIGTERM (no handler passes it on)
SERVER = "import subprocess, sys, time; c = subprocess.Popen([sys.executable, '-c', 'import time; " \
         "time.sleep(120)']); open(sys.argv[1], 'w').write(str(c.pid)); time.sleep(120)"  # fmt: skip

# `cascade ui` as far as the guard can tell: it starts the guard in a session of its own, then waits
UI = textwrap.dedent("""
    import os, subprocess, sys, time
    guard = subprocess.Popen([sys.executable, "-m", "cascade_repro.store.ui_guard", str(os.getpid()),
                              sys.executable, "-c", sys.argv[1], sys.argv[2]], start_new_session=True)
    print(guard.pid, flush=True)
    time.sleep(120)
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
def test_the_servers_whole_group_stops_when_cascade_ui_is_killed(tmp_path: Path) -> None:
    child_file = tmp_path / "child"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}
    ui = subprocess.Popen([sys.executable, "-c", UI, SERVER, str(child_file)], stdout=subprocess.PIPE,
                          text=True, env=env)  # fmt: skip
    assert ui.stdout is not None
    guard = int(ui.stdout.readline())
    try:
        deadline = time.monotonic() + 60
        while not (child_file.exists() and child_file.read_text()):
            assert ui.poll() is None and time.monotonic() < deadline, "the server never started its child"
            time.sleep(0.05)
        server_child = int(child_file.read_text())
        ui.kill()
        ui.wait()
        assert process_gone(guard) and process_gone(server_child), "the server's child outlived cascade ui"
    finally:
        ui.kill()
        with contextlib.suppress(OSError):
            os.killpg(guard, signal.SIGKILL)
