"""The child's exit facts survive what real training code does (issue 14, defect 1)."""

from __future__ import annotations

import json

import pytest

from tests.plugin import Project

pytestmark = pytest.mark.slow

# Frameworks (GitPython, MLflow, Lightning, HF) run bare program names: `os.get_exec_path()` then
# looks up os.environ[b"PATH"], a bytes key, through the environment-read recorder.
SUBPROCESS_SCRIPT = """\
import os
import subprocess

import torch

import cascade_repro

subprocess.run(["true"], check=True)
lr = float(os.environ.get("MY_LR", "0.1"))
torch.manual_seed(cascade_repro.params()["seed"])
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=lr)
x = torch.randn(32, 4)
for step in range(5):
    opt.zero_grad()
    loss = (model(x) - x.sum(1, keepdim=True)).pow(2).mean()
    loss.backward()
    opt.step()
print("done", flush=True)
"""


def test_a_subprocess_in_the_script_keeps_the_record_whole_and_restorable(project: Project) -> None:
    project.write("sub.py", SUBPROCESS_SCRIPT)
    project.commit("a script that runs a program")
    result = project.cascade("run", "--tag", "sub", "sub.py", env={"MY_LR": "0.05"}, check=True)
    assert "Traceback" not in result.stderr and "TypeError" not in result.stderr, result.stderr
    (run,) = project.runs()
    record = project.manifest(run.info.run_id)
    assert record["torch"].get("probed", True) is not False and record["torch"]["version"]
    assert "num_threads" in record["torch"]  # the full stack, probed in the child at exit
    assert record["environment_read"]["MY_LR"] == "0.05"
    assert not (record["outcome"] or {}).get("child_errors")
    restored = project.cascade("restore", "sub", "--json")
    assert restored.returncode == 0, restored.stderr
    data = json.loads(restored.stdout)["data"]
    assert data["plan"]["environment"]["MY_LR"] == "0.05"
    assert data["verdict"]["verdict"] == "BITWISE_IDENTICAL"


# A script that ends with os._exit() (a distributed script not waiting on its process group, a
# SIGTERM handler of its own) skips atexit, where cascade wrote its last trace records, the exit
# facts and the metrics still queued: the run said FINISHED with 1 step traced of 40.
HARD_EXIT_SCRIPT = """\
import os
import signal

import torch

import cascade_repro

lr = float(os.environ.get("MY_LR", "0.1"))
preempt_at = int(os.environ.get("PREEMPT_AT", "-1"))
signal.signal(signal.SIGTERM, lambda signum, frame: os._exit(3))  # a preemption handler of its own
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=lr)
x = torch.randn(32, 4)
for step in range(40):
    opt.zero_grad()
    loss = (model(x) - x.sum(1, keepdim=True)).pow(2).mean()
    loss.backward()
    opt.step()
    cascade_repro.log_metrics({"loss": loss.item()}, step=step)
    if step == preempt_at:
        os.kill(os.getpid(), signal.SIGTERM)
print("done", flush=True)
os._exit(0)
"""


def _steps(trace: list[dict]) -> list[int]:
    return [record["step"] for record in trace if "loss" in record]


def test_a_script_ending_with_os_exit_keeps_its_trace_exit_facts_and_metrics_and_restores(
    project: Project,
) -> None:
    project.write("hard.py", HARD_EXIT_SCRIPT)
    project.commit("a script that ends with os._exit")
    run = project.record("--tag", "hard", "hard.py", env={"MY_LR": "0.05"})
    assert _steps(project.trace(run)) == list(range(40))
    record = project.manifest(run)
    assert record["environment_read"]["MY_LR"] == "0.05"
    assert "num_threads" in record["torch"]  # probed in the child at exit
    history = project.client().get_metric_history(run, "loss")
    assert sorted(point.step for point in history) == list(range(40))
    restored = project.cascade("restore", "hard", "--json")
    assert restored.returncode == 0, restored.stderr
    verdict = json.loads(restored.stdout)["data"]["verdict"]
    assert verdict["verdict"] == "BITWISE_IDENTICAL", verdict
    assert verdict["steps"] == {"a": 40, "b": 40, "compared": 40}, verdict


def test_a_script_whose_signal_handler_calls_os_exit_keeps_the_steps_it_ran(project: Project) -> None:
    project.write("hard.py", HARD_EXIT_SCRIPT)
    project.commit("a script that ends with os._exit")
    result = project.cascade("run", "hard.py", env={"PREEMPT_AT": "20"})
    assert result.returncode == 3, result.stderr
    run = project.only_run().info.run_id
    trace = project.trace(run)
    assert _steps(trace) == list(range(21))
    assert "unfinished" not in trace[-1]
    assert len(project.client().get_metric_history(run, "loss")) == 21
