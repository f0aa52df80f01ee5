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
