"""The run directory's disk fills up while the script runs: the script is never blocked, the run is
closed, and the record says what is missing instead of a silent success."""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path
from typing import Iterator

import pytest

from tests.faults.helpers import Background, process_gone, small_tmpfs
from tests.plugin import Project

pytestmark = [pytest.mark.slow, pytest.mark.requires_root]

SCRIPT = """
import sys
import cascade_repro
for i in range(4000):
    print(f"line {i:05d} " + "x" * 100)
    cascade_repro.log_metrics({"m": float(i)}, step=i)
print("the end", flush=True)
"""


@pytest.fixture
def full_runs_dir(project: Project) -> Iterator[Path]:
    """`.cascade/runs` on a 96 KiB tmpfs (root only; where mounting is not allowed the test says so)."""
    with small_tmpfs(project.root / ".cascade" / "runs", "96k") as runs:
        yield runs


def test_a_full_run_directory_never_blocks_the_script_and_the_run_says_it_is_incomplete(
    project: Project, full_runs_dir: Path
) -> None:
    project.write("chatty.py", SCRIPT)
    project.commit("chatty")
    result = project.cascade("run", "chatty.py", timeout=240)  # hung until killed before the fix
    assert "the end" in result.stdout  # the terminal got every line although the log could not
    assert result.returncode == 4, (result.returncode, result.stderr)
    assert "the run directory's disk filled up (No space left" in result.stderr
    assert "output log is incomplete" in result.stderr and "metric points are being dropped" in result.stderr
    (run,) = project.runs()
    assert run.info.status == "FINISHED"  # the script's work is recorded, and its record says what is not
    record = project.manifest(run.info.run_id)
    assert record["outcome"]["output_log"].startswith("incomplete: No space left on device after")
    history = project.client().get_metric_history(run.info.run_id, "m")
    claimed = record["metrics"]["keys"].get("m", {}).get("count", 0)  # no key when none were stored
    assert claimed == len(history) < 4000  # points were dropped (said above); the record claims no more


@pytest.mark.parametrize(("free_pages", "verb"), [(0, "make"), (1, "prepare")], ids=["full", "one-page-free"])
def test_a_disk_already_full_stops_the_run_before_the_script_with_the_fix_named(
    project: Project, full_runs_dir: Path, free_pages: int, verb: str
) -> None:
    """Found by trying it: with `.cascade/runs` on a disk already full, `cascade run` printed a bare
    `OSError: [Errno 28]` and left a half-made hidden run directory behind. With one page free the
    run directory and its owner fit, the hyperparameters for the script do not: the same bare error,
    at params.json, and the directory left behind."""
    project.write("hello.py", "open('ran', 'w').write('yes')\nprint('the script ran')\n")
    project.commit("hello")
    fd = os.open(full_runs_dir / "filler", os.O_WRONLY | os.O_CREAT)
    with contextlib.suppress(OSError):
        while True:
            os.write(fd, bytes(4096))
    os.ftruncate(fd, os.fstat(fd).st_size - 4096 * free_pages)
    os.close(fd)
    result = project.cascade("run", "hello.py", timeout=120)
    assert result.returncode == 1, (result.returncode, result.stderr)
    assert f"cannot {verb} the run's directory in .cascade/runs" in result.stderr, result.stderr
    assert "No space left on device" in result.stderr and "free space on the disk" in result.stderr
    assert "Traceback" not in result.stderr and "OSError" not in result.stderr
    assert "the script ran" not in result.stdout and not (project.root / "ran").exists()  # nothing ran
    assert sorted(p.name for p in full_runs_dir.iterdir()) == ["filler"]  # nothing half-made is left
    assert project.runs() == []


SAVES_ON_A_FULL_RUN_DIR = """
import os, sys, torch
def fill(directory):
    fd = os.open(os.path.join(directory, "filler"), os.O_WRONLY | os.O_CREAT)
    for size in (1 << 16, 1 << 12, 1):
        try:
            while True:
                os.write(fd, bytes(size))
        except OSError:
            pass
    os.close(fd)
torch.manual_seed(0)
model = torch.nn.Linear(8, 8)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(20):
    opt.zero_grad()
    model(torch.randn(4, 8)).pow(2).mean().backward()
    opt.step()
    if step == 4:  # something else fills the disk that holds the run directory
        fill(os.path.dirname(os.environ["CASCADE_RUN_DIR"]))
        # lines of more than a pipe holds: written once cascade has read (and logged) most of them,
        # so the output log meets the full disk before the script's end frees the reserve
        sys.stdout.write(("x" * 63 + chr(10)) * 4096)
        sys.stdout.flush()
    if step in (9, 14):
        torch.save(model.state_dict(), f"ck{step}.pt")
print("the end", flush=True)
"""


@pytest.mark.parametrize("size", ["8m", "200k"])
def test_a_checkpoint_saved_on_a_full_run_directory_never_fails_the_scripts_save(
    project: Project, size: str
) -> None:
    """Found on pytorch/examples' word_language_model: its `torch.save` raised OSError(ENOSPC) from
    cascade's hook, which noted the save in the run directory's full disk; the script died (exit 1)
    where plain python finished. The notes now wait in memory and are written at the end, from the
    run directory's reserve: the script ends as it would, and the checkpoints are in the record.
    On a disk too small for a reserve (200k) they are lost, and (found on Lightning) the run said
    FINISHED, exit 0, with no word of it: the record now says what it lacks, and the exit is 4."""
    project.write("saves.py", SAVES_ON_A_FULL_RUN_DIR)
    project.commit("saves")
    with small_tmpfs(project.root / ".cascade" / "runs", size):
        result = project.cascade("run", "saves.py", timeout=240)
    assert "the end" in result.stdout, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    (run,) = project.runs()
    assert run.info.status == "FINISHED", result.stderr
    assert result.returncode == 4, result.stderr  # the record is incomplete, and says what it lacks
    record = project.manifest(run.info.run_id)
    assert record["outcome"]["exit_code"] == 0
    if size == "200k":  # no room for a reserve: the script's last words are lost, and that is said
        missing = record["outcome"]["missing"]
        said = "the script's exit facts, never written: the run directory's disk is full"
        assert any(m.startswith(said) for m in missing), missing
        return
    assert record["outcome"]["output_log"].startswith("incomplete: No space left"), record["outcome"]
    assert record["trace"]["steps"] == 20, record["trace"]  # written at the end, from the reserve
    saved = {Path(c["path"]).name: c for c in record["checkpoints"]}
    assert sorted(saved) == ["ck14.pt", "ck9.pt"], record["checkpoints"]
    assert saved["ck9.pt"]["step"] == 9 and saved["ck14.pt"]["step"] == 14


TRACE_STOPS_THEN_HANGS = """
import os, time, torch
fill = {fill}
torch.manual_seed(0)
model = torch.nn.Linear(8, 8)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
step = 0
deadline = None
while True:
    opt.zero_grad()
    model(torch.randn(4, 8)).pow(2).mean().backward()
    opt.step()
    step += 1
    if step == 5:  # something else fills the disk; the trace's next write fails and stops it
        fill(os.path.dirname(os.environ["CASCADE_RUN_DIR"]))
        deadline = time.monotonic() + 2.0  # past the trace's next write (every half second)
    if deadline is not None and time.monotonic() > deadline:
        os.makedirs("out", exist_ok=True)
        open("out/ready", "w").write(str(os.getpid()))
        deadline = float("inf")  # then trains on until its parent's death stops it
    time.sleep(0.005)
"""


def test_a_recovered_run_whose_trace_a_full_disk_stopped_says_so(project: Project) -> None:
    """The last stop's gap: `cascade run` said what a full disk took from the trace, the recovery of a
    run whose parent died did not (FINISHED or KILLED, nothing missing named)."""
    fill = SAVES_ON_A_FULL_RUN_DIR.split("def fill(directory):", 1)[1].split("torch.manual_seed", 1)[0]
    script = TRACE_STOPS_THEN_HANGS.replace("fill = {fill}\n", "def fill(directory):" + fill)
    project.write("stops.py", script)
    project.commit("stops")
    with small_tmpfs(project.root / ".cascade" / "runs", "8m"):
        run = Background(project, "stops.py")
        run.wait_for(lambda: (project.root / "out" / "ready").exists() and run.said("the step trace stopped"),
                     "the trace to stop, said")  # (the 2 s the script gives it may not be enough under load)
        child = int((project.root / "out" / "ready").read_text())
        os.kill(run.process.pid, signal.SIGKILL)  # the parent only: the child gets SIGTERM, and flushes
        run.process.wait(timeout=30)
        assert process_gone(child, 30)
        assert any("the step trace stopped" in line for line in run.stderr), run.output()
        listed = project.cascade("ls", timeout=120)
        assert listed.returncode == 0, listed.stderr
        assert "recovered" in listed.stderr, listed.stderr
    (recovered,) = project.runs()
    missing = project.manifest(recovered.info.run_id)["outcome"]["missing"]
    said = [m for m in missing if m.startswith("the step trace stopped at step ")]
    assert said and "the run directory's disk is full" in said[0], missing
