"""`cascade run` and `cascade verify` on the two things nearly every GPU training script adds: mixed
precision's GradScaler and torch.compile. A scaled loss was recorded scaled and a skipped step merged
into the next; a compiled model's parameters were named `_orig_mod.…`, so a compiled run "DIVERGED at
step 0" from the same run uncompiled, and every compiled run printed dynamo's warning about global
module hooks (cascade's own)."""

from __future__ import annotations

import json
import struct
from typing import Any

import pytest

from tests.plugin import Project

pytestmark = pytest.mark.slow

TRAIN = """
import json, sys, torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
if sys.argv[1] == "compiled":
    model = torch.compile(model, backend="eager")
opt = torch.optim.SGD(model.parameters(), lr=0.01)
scaler = torch.amp.GradScaler("cpu", init_scale=1024, enabled=sys.argv[2] == "scaled")
x, y = torch.randn(64, 4), torch.randn(64, 1)
losses = []
for i in range(8):
    loss = torch.nn.functional.mse_loss(model(x), y) * (1e36 if i == 3 else 1.0)
    losses.append(loss.item())
    opt.zero_grad()
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
json.dump(losses, open("losses.json", "w"))
"""


def _verify(project: Project, a: str, b: str) -> tuple[int, dict[str, Any]]:
    result = project.cascade("verify", a, b, "--json")
    assert result.returncode in (0, 3), result.stderr
    return result.returncode, json.loads(result.stdout)["data"]


def _trace(project: Project, run_id: str) -> list[dict[str, Any]]:
    local = project.client().download_artifacts(run_id, "cascade/trace.jsonl", str(project.root / ".dl"))
    with open(local) as lines:
        return [json.loads(line) for line in lines]


def _run(project: Project, *args: str) -> str:
    before = {r.info.run_id for r in project.runs()}
    result = project.cascade("run", "train.py", *args, check=True)
    assert "global hooks" not in result.stderr, result.stderr
    (new,) = {r.info.run_id for r in project.runs()} - before
    return str(new)


def test_a_compiled_scaled_run_records_the_scripts_losses_and_steps_and_verifies_against_eager(
    project: Project,
) -> None:
    project.write("train.py", TRAIN)
    project.write(".gitignore", "mlflow.db\nmlruns/\n.cascade/\nout/\n.dl/\nlosses.json\n")
    project.commit("amp and compile")
    eager = _run(project, "eager", "scaled")
    losses = json.loads((project.root / "losses.json").read_text())
    compiled = _run(project, "compiled", "scaled")
    records = [r for r in _trace(project, compiled) if "step" in r]
    assert [r["step"] for r in records] == list(range(8))  # the scaler skipped step 3: still step 3
    as_float32 = [struct.unpack("f", struct.pack("f", value))[0] for value in losses]
    assert [r["loss"]["value"] for r in records] == as_float32  # the script's, not scaled
    assert [r.get("skipped", False) for r in records] == [False, False, False, True] + [False] * 4
    code, verdict = _verify(project, eager, compiled)
    assert (code, verdict["verdict"]) == (0, "BITWISE_IDENTICAL"), verdict["summary"]
    assert verdict["steps"]["compared"] == 8
