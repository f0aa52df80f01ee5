"""cascade's own work at the script's end is done where the script ends with os._exit (child/exit_work.py)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

PROGRAM = """\
import atexit, os, sys, threading
from cascade_repro.child import exit_work

out = sys.argv[1]
def note(word):
    with open(out, "a") as file:
        file.write(f"{os.getpid()} {word}\\n")

held = threading.Lock()
if sys.argv[2] == "atexit":  # a library's handler, run after cascade's, ending the process itself
    atexit.register(lambda: os._exit(7))
exit_work.at_exit(note, "first registered")
exit_work.at_exit(note, "last registered")
if sys.argv[2] == "blocked":
    exit_work.at_exit(lambda: held.acquire() and note("never"))  # as a hook's lock, held by the caller
atexit.register(note, "the script's own atexit")
exit_work.install(wait_s=1.0)
if sys.argv[2] == "fork":
    child = os.fork()
    if child == 0:
        os._exit(0)  # as a DataLoader worker ends
    os.waitpid(child, 0)
if sys.argv[2] == "atexit":
    sys.exit(0)
held.acquire()
os._exit(7)
"""


def _run(tmp_path: Path, mode: str) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    out = tmp_path / "out.txt"
    result = subprocess.run([sys.executable, "-c", PROGRAM, str(out), mode], capture_output=True, text=True,
                            timeout=60)  # fmt: skip
    return result, out.read_text().splitlines() if out.exists() else []


def test_os_exit_does_cascades_work_last_registered_first_and_not_the_scripts_atexit(tmp_path: Path) -> None:
    result, lines = _run(tmp_path, "plain")
    assert result.returncode == 7, result.stderr
    assert [line.split(" ", 1)[1] for line in lines] == ["last registered", "first registered"]


def test_a_forked_copy_ending_with_os_exit_does_none_of_it(tmp_path: Path) -> None:
    result, lines = _run(tmp_path, "fork")
    assert result.returncode == 7, result.stderr
    assert len({line.split(" ", 1)[0] for line in lines}) == 1  # one process: the one that installed it
    assert [line.split(" ", 1)[1] for line in lines] == ["last registered", "first registered"]


def test_work_that_cannot_finish_is_given_up_after_the_wait_and_the_exit_status_kept(tmp_path: Path) -> None:
    started = time.monotonic()
    result, lines = _run(tmp_path, "blocked")
    assert result.returncode == 7
    assert time.monotonic() - started < 30
    # (the blocked part, registered last, came first: the others are done all the same)
    assert [line.split(" ", 1)[1] for line in lines] == ["last registered", "first registered"]
    assert "os._exit(7)" in result.stderr and "1 part(s)" in result.stderr, result.stderr


def test_a_library_atexit_handler_calling_os_exit_after_cascades_does_not_do_the_work_twice(
    tmp_path: Path,
) -> None:
    result, lines = _run(tmp_path, "atexit")
    assert result.returncode == 7, result.stderr
    words = [line.split(" ", 1)[1] for line in lines]
    assert words == ["the script's own atexit", "last registered", "first registered"]
