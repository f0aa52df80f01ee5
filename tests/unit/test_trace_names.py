"""The names a step's record gives the parameters: the modules the script built name them without a
scan of every live object, and the names are the ones that scan gives, on the ways real scripts hold
their models (several roots, a wrapper, an EMA copy, a model unpickled, a parameter outside any
module, one parameter under two roots, weights updated by hand). In a subprocess: the hooks are
process-wide."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

PROGRAM = """
import copy, gc, io, json, sys, torch
from pathlib import Path
from cascade_repro.child import step_values
from cascade_repro.child.trace import StepTracer

out, scenario = Path(sys.argv[1]), sys.argv[2]
tracer = StepTracer(torch, out / "trace.jsonl", budget=0.0)
tracer.install()
scans = []
scan = gc.get_objects
gc.get_objects = lambda *a: scans.append(1) or scan(*a)

class Wrapper(torch.nn.Module):  # as DDP, or torch.compile's, holds a model
    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        return self.inner(x)

def net(width=4):
    return torch.nn.Sequential(torch.nn.Linear(3, width), torch.nn.ReLU(), torch.nn.Linear(width, 1))

torch.manual_seed(0)
model, extra = net(), []
if scenario == "wrapped":
    model = Wrapper(model)
elif scenario == "loaded":  # the whole model pickled: built before, it registers nothing here
    buffer = io.BytesIO()
    torch.save(model, buffer)
    model = torch.load(io.BytesIO(buffer.getvalue()), weights_only=False)
elif scenario == "bare":  # a learnt temperature beside the model, in no module
    extra = [torch.nn.Parameter(torch.ones(1))]
ema = copy.deepcopy(model) if scenario == "ema" else None
other = net(2 if scenario == "two roots" else 4) if scenario in ("two roots", "shared", "gan") else None
if scenario == "shared":
    other[0].weight = model[0].weight  # one parameter under two roots
elif scenario == "gan":  # a second model, unpickled, with its own optimizer that steps second
    other = copy.deepcopy(other)
params = list(model.parameters()) + extra + (list(other.parameters()) if scenario == "two roots" else [])
opt = torch.optim.SGD(params, lr=0.1) if scenario != "by hand" else None
other_opt = torch.optim.SGD(other.parameters(), lr=0.1) if scenario == "gan" else None
x, y = torch.randn(8, 3), torch.randn(8, 1)
for step in range(3):
    loss = torch.nn.functional.mse_loss(model(x) * (extra[0] if extra else 1), y)
    if other is not None:
        loss = loss + other(x).sum()
    if opt is not None:
        opt.zero_grad()
        loss.backward()
        opt.step()
        if other_opt is not None:
            other_opt.step()
    else:
        for p in model.parameters():
            p.grad = None
        loss.backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= 0.1 * p.grad
    if ema is not None:
        with torch.no_grad():
            for e, p in zip(ema.parameters(), model.parameters()):
                e.mul_(0.9).add_(p, alpha=0.1)
tracer.close()
found = step_values.named_parameters(torch)
by_scan = {id(p): name for name, p in found}
traced = params if opt is not None else [p for _, p in found]
if other_opt is not None:  # (the second optimizer's steps: the odd ones)
    traced = list(other.parameters())
expected, named = [], set()
for i, p in enumerate(traced):  # a path two roots share: told apart by the parameter's place
    name = by_scan.get(id(p)) or f"param{i}"
    expected.append(name if name not in named else f"{name}@{i}")
    named.add(name)
expected.sort()
records = [json.loads(line) for line in (out / "trace.jsonl").read_text().splitlines()]
records = records[1::2] if other_opt is not None else records
print(json.dumps({"scans": len(scans), "expected": expected,
                  "recorded": [sorted(r["params_after"]) for r in records]}))
"""


def _traced(tmp_path: Path, scenario: str) -> dict[str, object]:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(PROGRAM), str(tmp_path), scenario],
                          check=True, capture_output=True, text=True, timeout=120)  # fmt: skip
    return json.loads(done.stdout.splitlines()[-1])  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    ("scenario", "scans"),
    [
        ("plain", 0), ("wrapped", 0),
        ("two roots", 0),  # a backbone and a head, both Sequential: "0.weight" in each
        ("ema", 0),  # the copy registered nothing, but the optimizer steps none of its parameters
        ("loaded", 1), ("bare", 1), ("shared", 1),  # the built modules do not name them all, or twice
        ("gan", 1),  # the second optimizer's model: copied, so scanned for when that optimizer steps
        ("by hand", 1),  # a record made by hand holds every live module's parameters
    ],
)  # fmt: skip
def test_the_parameters_are_named_as_a_scan_of_every_live_module_names_them(
    tmp_path: Path, scenario: str, scans: int
) -> None:
    traced = _traced(tmp_path, scenario)
    # the scan at the end, where the test compares, is not counted
    assert traced["scans"] == scans + 1, traced
    recorded = traced["recorded"]
    assert isinstance(recorded, list) and len(recorded) == 3
    assert all(names == traced["expected"] for names in recorded), traced
