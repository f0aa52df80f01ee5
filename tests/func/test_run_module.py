"""`cascade run -m PACKAGE.MODULE`: a module of the repository run by its name, as `python -m` runs it
(relative imports work, the working directory comes first on sys.path), recorded with its name and
its file, and restored by its name from the worktree."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.plugin import Project, git

pytestmark = pytest.mark.slow

TRAIN = """import argparse
import sys

import torch

from . import SCALE
from .model import make

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=10)
steps = parser.parse_args().steps
print(f"ran {__spec__.name} from {sys.argv[0]} as {__name__}")
torch.manual_seed(0)
model = make()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(64, 8), torch.randn(64, 1)
for step in range(steps):
    opt.zero_grad()
    loss = ((model(x) * SCALE - y) ** 2).mean()
    loss.backward()
    opt.step()
"""


def _package(project: Project) -> None:
    project.write("mypkg/__init__.py", "SCALE = 1.0\n")
    project.write("mypkg/model.py", "import torch\n\n\ndef make():\n    return torch.nn.Linear(8, 1)\n")
    project.write("mypkg/train.py", TRAIN)
    project.commit("mypkg")


def test_a_module_run_by_name_is_recorded_and_restored_by_name(project: Project) -> None:
    _package(project)

    run_id = project.record("--tag", "v1", "--seed", "5", "-m", "mypkg.train", "--steps", "12")

    record = project.manifest(run_id)
    command = record["command"]
    assert command["module"] == "mypkg.train"
    assert command["script"] == "mypkg/train.py"  # the code that ran, as for a script
    assert command["argv"] == ["--steps", "12"]  # `--steps` is the module's, not cascade's
    assert command["invocation"][-4:] == ["-m", "mypkg.train", "--steps", "12"]
    assert record["params"]["seed"] == 5
    assert record["trace"]["steps"] == 12
    assert record["git"]["commit"] == git(project.root, "rev-parse", "HEAD").strip()
    shown = project.cascade("show", "v1", check=True).stdout
    assert " -m mypkg.train --steps 12\n" in shown and "--seed 5" in shown, shown

    project.write("mypkg/__init__.py", "SCALE = 3.0\n")  # a later commit changes what the module imports
    project.commit("another scale")
    restored = project.cascade("restore", "v1", "--json")

    assert restored.returncode == 0, restored.stderr
    data = json.loads(restored.stdout)["data"]
    assert data["verdict"]["verdict"] == "BITWISE_IDENTICAL", data["verdict"]
    worktree = Path(data["plan"]["workdir"])
    assert f"ran mypkg.train from {worktree / 'mypkg' / 'train.py'} as __main__" in restored.stderr
    assert f"re-running -m mypkg.train --steps 12 in {worktree}" in restored.stderr
    assert data["plan"]["module"] == "mypkg.train"
    rerun = project.manifest(data["run"]["run_id"])
    assert rerun["command"]["module"] == "mypkg.train"
    assert rerun["command"]["script"] == "mypkg/train.py"
    by_hand = json.loads(project.cascade("restore", "v1", "--no-run", "--json", check=True).stdout)["data"]
    assert "-m mypkg.train --steps 12" in by_hand["rerun_command"]


@pytest.mark.parametrize(
    ("name", "said"),
    [
        ("mypkg.nosuch", "no module named mypkg.nosuch (looked in"),
        ("mypkg.trian", "no module named mypkg.trian; did you mean mypkg.train?"),
        ("mypgk.train", "no module named mypgk.train; did you mean mypkg.train?"),
        ("mypkg", "mypkg is a package without a __main__.py"),
        ("mypkg.model.deeper", "mypkg.model is a module, not a package"),
        ("json.tool", "json/tool.py, outside the git repository"),  # the standard library's
        ("my pkg", "not a module name"),
        ("torch.distributed.run", "is torchrun, not a training module"),  # the hint: --nproc-per-node
    ],
)
def test_a_module_that_cannot_run_here_is_refused_before_anything_runs(
    project: Project, name: str, said: str
) -> None:
    _package(project)

    refused = project.invoke("run", "-m", name)

    assert refused.returncode == 2, refused.stderr
    assert said in refused.stderr
    assert project.runs() == []
