"""A step that never returned: a run stopped while inside an optimizer step (a script that steps
with a closure, as Lightning's `training_step` does, is there most of the time), or a step whose
optimizer raised while the script went on (a batch skipped after an out-of-memory error).

Found on a LightningCLI project: `kill -9` of `cascade` after 25 s, then `restore` re-ran "15216
steps" and said DIVERGED at step 15215, every loss equal. The weights read at exit were those before
step 15215's update, recorded as after it; the re-run completed that step.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from tests.faults.helpers import Background, marker, process_gone
from tests.plugin import Project

pytestmark = pytest.mark.slow

HOLD_AT = 150

CLOSURE = f"""\
import os
import sys
import time
from pathlib import Path

import torch

torch.manual_seed(0)
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
x = torch.randn(64, 8)
for step in range(400):
    def closure():
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), x.sum(dim=1, keepdim=True))
        loss.backward()
        if step == {HOLD_AT} and Path(sys.argv[1]).exists():  # the test's run, until its signal
            Path("out").mkdir(exist_ok=True)
            Path("out/hold").write_text(str(os.getpid()))
            while Path(sys.argv[1]).exists():
                time.sleep(0.05)
        return loss
    opt.step(closure)
"""


def _commit_kept(record: Path) -> bool:
    """Whether the run's local record holds its commit yet (the record's skeleton comes first)."""
    try:
        return bool(json.loads(record.read_text()).get("git", {}).get("commit"))
    except (OSError, ValueError):
        return False


def _stopped_inside_step(project: Project, how: signal.Signals, budget: str) -> dict:
    project.write("closure.py", CLOSURE)
    project.commit("a script that steps with a closure")
    holding = project.root.parent / "holding"
    holding.touch()
    run = Background(project, "--trace-budget", budget, "closure.py", str(holding))
    run.wait_for(lambda: marker(project, "hold").exists(), f"step {HOLD_AT}")
    child = int(marker(project, "hold").read_text())
    spool = run.run_dir()
    assert spool is not None  # the code recorded before the signal, as after the 25 s of the defect
    run.wait_for(lambda: _commit_kept(spool / "run.json"), "the record of the code")
    run.process.send_signal(how)
    run.finish()
    assert process_gone(child), "the script outlived its cascade"
    holding.unlink()
    project.cascade("ls", check=True)  # (after a SIGKILL: the run is recovered, KILLED)
    return project.manifest(project.only_run().info.run_id)


@pytest.mark.parametrize(
    ("how", "budget"),
    [(signal.SIGINT, "0"), (signal.SIGKILL, "0.0001")],  # a record at every step; records thinned by then
    ids=["ctrl-c-every-step-recorded", "kill-9-of-cascade-records-thinned"],
)
def test_a_run_stopped_inside_its_optimizer_step_restores_bitwise(
    project: Project, how: signal.Signals, budget: str
) -> None:
    recorded = _stopped_inside_step(project, how, budget)
    assert recorded["outcome"]["status"] == "KILLED", recorded["outcome"]
    result = project.cascade("restore", recorded["run_id"][:12], "--json")
    data = json.loads(result.stdout)["data"] if result.stdout.strip() else {}
    assert result.returncode == 0, result.stderr
    # steps 0..149 ended; step 150 never returned (its update had not run): it is not re-run
    assert f"KILLED after {HOLD_AT} steps" in result.stderr, result.stderr
    assert data["verdict"]["verdict"] == "BITWISE_IDENTICAL", data["verdict"]
    assert data["verdict"]["steps"]["a"] == data["verdict"]["steps"]["b"] == HOLD_AT


def test_the_record_of_a_step_that_never_returned_says_so(project: Project, tmp_path: Path) -> None:
    """Its weights are read at exit, inside the step (before its update, or partway through one):
    they are not "after the step", and the record says the step did not end."""
    recorded = _stopped_inside_step(project, signal.SIGINT, "0")
    trace = Path(
        project.client().download_artifacts(recorded["run_id"], recorded["trace"]["artifact"], tmp_path)
    )
    records = [json.loads(line) for line in trace.read_text().splitlines()]
    steps = [r for r in records if "step" in r]
    assert [r["step"] for r in steps] == list(range(HOLD_AT + 1))
    assert steps[-1].get("unfinished") is True and all("unfinished" not in r for r in steps[:-1])
    # the weights at exit are those after the step before: nothing updated them since
    assert steps[-1]["params_after"] == steps[-2]["params_after"]
    shown = project.cascade("show", recorded["run_id"][:12], "--trace", check=True).stdout
    assert (
        f"steps 0..{HOLD_AT} (the run ended inside step {HOLD_AT}: its weights are those at exit)"
        in " ".join(shown.split())
    ), shown


SKIPS_A_BATCH = """\
import torch

torch.manual_seed(0)
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(64, 8)
for step in range(20):
    def closure():
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), x.sum(dim=1, keepdim=True))
        loss.backward()
        if step == 5:
            raise RuntimeError("CUDA out of memory (pretend)")
        return loss
    try:
        opt.step(closure)
    except RuntimeError:  # fairseq-style: skip the batch that ran out of memory
        opt.zero_grad()
"""


def test_a_run_that_skipped_a_step_whose_optimizer_raised_restores_bitwise(project: Project) -> None:
    """Its trace recorded step 5 twice, and `restore` refused it: "the trace ... is damaged at record
    7: its step 5 does not follow step 5"."""
    project.write("skips.py", SKIPS_A_BATCH)
    project.commit("a script that skips a batch its optimizer step failed on")
    project.cascade("run", "--tag", "v1", "skips.py", check=True)
    result = project.cascade("restore", "v1", "--json")
    assert result.returncode == 0, result.stderr
    verdict = json.loads(result.stdout)["data"]["verdict"]
    assert verdict["verdict"] == "BITWISE_IDENTICAL" and verdict["steps"]["a"] == 20, verdict
    shown = " ".join(project.cascade("show", "v1", "--trace", check=True).stdout.split())
    said = "steps 0..19; 1 step(s) did not end, their optimizer raised and the script went on: 5"
    assert said in shown, shown
