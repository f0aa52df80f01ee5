"""The parent's hold on the training process (supervisor.py), on real processes and real signals."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from cascade_repro.run_output import RunOutput
from cascade_repro.supervisor import Child

# Installs its Ctrl-C handler, says so, then waits for the Ctrl-C and exits 3 with a mark.
STUBBORN = """
import pathlib, signal, sys, time
def interrupted(signum, frame):
    pathlib.Path(sys.argv[1], "interrupted").write_text(str(signum))
    sys.exit(3)
signal.signal(signal.SIGINT, interrupted)
pathlib.Path(sys.argv[1], "ready").write_text("1")
time.sleep(60)
"""


def _started(tmp_path: Path, notes: list[str]) -> Child:
    output = RunOutput(tmp_path / "output.log", tmp_path, progress=False)
    child = Child([sys.executable, "-c", STUBBORN, str(tmp_path)], dict(os.environ), tmp_path, output,
                  notes.append)  # fmt: skip
    deadline = time.monotonic() + 30
    while not (tmp_path / "ready").exists():
        assert child.process.poll() is None and time.monotonic() < deadline, "the script did not start"
        time.sleep(0.01)
    return child


def test_a_ctrl_c_before_the_parent_waits_goes_to_the_child(tmp_path: Path) -> None:
    """`cascade run` records the run (captures, opens the store) between starting the script and
    waiting for it; a Ctrl-C then must reach the script, as during the wait, not end the parent."""
    before = signal.getsignal(signal.SIGINT)
    notes: list[str] = []
    child = _started(tmp_path, notes)
    try:
        try:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.2)  # the handler runs here, in the main thread, before any wait
        except KeyboardInterrupt:
            child.terminate()
            pytest.fail("a Ctrl-C before the wait ended the parent instead of reaching the script")
        ended = child.wait()
    finally:
        child.restore_signals()
    assert (tmp_path / "interrupted").read_text() == str(int(signal.SIGINT))
    assert ended.exit_code == 3 and ended.signal_received == signal.SIGINT and ended.killed_by_signal is None
    assert signal.getsignal(signal.SIGINT) is before


def test_once_the_script_ended_a_ctrl_c_only_warns_until_the_record_is_closed(tmp_path: Path) -> None:
    before = signal.getsignal(signal.SIGINT)
    notes: list[str] = []
    child = _started(tmp_path, notes)
    child.process.send_signal(signal.SIGINT)
    try:
        ended = child.wait()
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.1)
    finally:
        child.restore_signals()
    assert ended.exit_code == 3 and ended.signal_received is None
    assert notes == ["finishing the run record, one moment..."]
    assert signal.getsignal(signal.SIGINT) is before


# Starts a process of its own that keeps the script's stdout and stderr (a server, a daemon), says
# what it did, and ends.
LEAVES_A_PROCESS = """
import subprocess, sys
keeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
open(sys.argv[1] + "/keeper", "w").write(str(keeper.pid))
print("the script is done", flush=True)
print("and says so on stderr", file=sys.stderr, flush=True)
"""


def test_a_process_the_script_left_holding_its_output_does_not_hold_the_run(tmp_path: Path) -> None:
    """The parent waited for the end of the script's output: 10 s per stream (20 s, the run's
    duration inflated) while a process it started still held them."""
    notes: list[str] = []
    output = RunOutput(tmp_path / "output.log", tmp_path, progress=False)
    child = Child([sys.executable, "-c", LEAVES_A_PROCESS, str(tmp_path)], dict(os.environ), tmp_path,
                  output, notes.append)  # fmt: skip
    try:
        started = time.monotonic()
        ended = child.wait()
        took = time.monotonic() - started
    finally:
        child.restore_signals()
        os.kill(int((tmp_path / "keeper").read_text()), signal.SIGKILL)
    assert ended.exit_code == 0
    assert took < 15, f"the parent waited {took:.1f} s for the output of a process the script left"
    log = (tmp_path / "output.log").read_text()
    assert "the script is done" in log and "and says so on stderr" in log  # nothing of the script's lost
    assert any("still holds" in note for note in notes), notes
