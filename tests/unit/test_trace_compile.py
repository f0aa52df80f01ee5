"""A model compiled by `torch.compile` (dynamo's OptimizedModule, which holds the model as
`_orig_mod`): its parameters are named as the uncompiled model's, so a compiled run and an uncompiled
one compare equal, and the trace's start at the first forward leaves no global module hook for dynamo
to warn about ("Using `torch.compile(module)` when there are global hooks on modules"), while step 0's
RNG state is still read after the script's own seeding. The "eager" backend: dynamo's wrapping
without inductor's compile. In a subprocess: the hooks are process-wide."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

PROGRAM = """
import json, random, sys, numpy, torch
from pathlib import Path
from cascade_repro.child.trace import StepTracer

out, scenario = Path(sys.argv[1]), sys.argv[2]
tracer = StepTracer(torch, out / "trace.jsonl", budget=0.0)
tracer.install()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
if scenario == "submodule":  # one part compiled: its path has `_orig_mod` in the middle
    model[0] = torch.compile(model[0], backend="eager")
elif scenario != "eager":
    model = torch.compile(model, backend="eager")
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(16, 4), torch.randn(16, 1)
torch.manual_seed(1), random.seed(1), numpy.random.seed(1)  # the script's seeding, after the compile
for step in range(3):
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
tracer.close()
hooks = torch.nn.modules.module._global_forward_pre_hooks
print(json.dumps({"global_hooks": len(hooks), "compile": torch.compile.__module__}))
"""


def _run(tmp_path: Path, scenario: str) -> tuple[list[dict[str, Any]], dict[str, Any], str]:
    out = tmp_path / scenario
    out.mkdir()
    command = [sys.executable, "-W", "always", "-c", textwrap.dedent(PROGRAM), str(out), scenario]
    done = subprocess.run(command, check=True, capture_output=True, text=True, timeout=300)
    records = [json.loads(line) for line in (out / "trace.jsonl").read_text().splitlines()]
    return records, json.loads(done.stdout.splitlines()[-1]), done.stderr


@pytest.mark.parametrize("scenario", ["compiled", "submodule"])
def test_a_compiled_model_is_traced_as_the_model_itself_without_dynamos_warning(
    tmp_path: Path, scenario: str
) -> None:
    eager, _, _ = _run(tmp_path, "eager")
    compiled, end, stderr = _run(tmp_path, scenario)
    assert "global hooks" not in stderr, stderr
    assert end == {"global_hooks": 0, "compile": "torch"}  # removed, and torch.compile is torch's again
    assert sorted(compiled[0]["params_before"]) == ["0.bias", "0.weight", "2.bias", "2.weight"]
    # the same training, the same record: names, weights, RNG read after the seeding, loss
    assert compiled == eager
