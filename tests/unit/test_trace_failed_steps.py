"""A step whose optimizer raised, and a script that went on (fairseq's and others' "skip the batch
that ran out of memory"): found on such a script, whose trace recorded step 5 twice; `restore`
then refused it as damaged ("its step 5 does not follow step 5")."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

SKIPPING = """
import json, random, sys, numpy, torch
from pathlib import Path
from cascade_repro.child.trace import StepTracer

out, closure_steps, budget = Path(sys.argv[1]), sys.argv[2] == "closure", float(sys.argv[3])
attempts, FAILING = int(sys.argv[4]), json.loads(sys.argv[5])
torch.set_num_threads(1)
tracer = StepTracer(torch, out / "trace.jsonl", budget=budget)
tracer.install()
torch.manual_seed(0), random.seed(0), numpy.random.seed(0)  # (their states are in the records too)
model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))

class Failing(torch.optim.SGD):
    def step(self, closure=None):
        if not closure_steps and attempt in FAILING:
            raise RuntimeError("out of memory (pretend)")
        return super().step(closure)

opt = Failing(model.parameters(), lr=0.05)
x, y = torch.randn(64, 8), torch.randn(64, 1)
losses = []
for attempt in range(attempts):
    def closure():
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        losses.append(loss.item())
        loss.backward()
        if attempt in FAILING:
            raise RuntimeError("out of memory (pretend)")
        return loss
    try:
        if closure_steps:
            opt.step(closure)
        else:
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            losses.append(loss.item())
            loss.backward()
            opt.step()
    except RuntimeError:  # the batch skipped
        opt.zero_grad()
tracer.close()
(out / "losses.json").write_text(json.dumps(losses))
"""


def _run(tmp_path: Path, closure: bool, budget: float, name: str, attempts: int = 30,
         failing: tuple[int, ...] = (5, 17)) -> tuple[list[dict[str, Any]], list[float]]:  # fmt: skip
    out = tmp_path / name
    out.mkdir()
    how = ("closure" if closure else "plain", str(budget), str(attempts), json.dumps(failing))
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(SKIPPING), str(out), *how],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = (out / "trace.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines], json.loads((out / "losses.json").read_text())


@pytest.mark.parametrize("closure", [True, False], ids=["closure", "no-closure"])
def test_a_step_whose_optimizer_raised_is_one_step_that_did_not_end(tmp_path: Path, closure: bool) -> None:
    records, losses = _run(tmp_path, closure, 0.0, "a")
    steps = [r["step"] for r in records]
    assert steps == list(range(30)), steps  # each attempt one step, in order: no step twice
    assert [r["step"] for r in records if r.get("unfinished")] == [5, 17]
    # each step's loss is its own attempt's, the failed ones' too
    assert [r["loss"]["value"] for r in records] == losses
    assert all("params_after" in r for r in records)
    again, _ = _run(tmp_path, closure, 0.0, "b")
    assert again == records  # the same script, the same trace


@pytest.mark.parametrize("closure", [True, False], ids=["closure", "no-closure"])
def test_a_failed_step_among_steps_without_records_is_counted(tmp_path: Path, closure: bool) -> None:
    """A tiny budget: past the first steps the hooks coast between records; a failed step among them
    still counts once (the records' steps are the full trace's)."""
    failing = (5, 201, 256, 290)  # past the first 128 steps: coasting over 201
    full, _ = _run(tmp_path, closure, 0.0, "full", 300, failing)
    thinned, _ = _run(tmp_path, closure, 0.0001, "thinned", 300, failing)
    steps = [r["step"] for r in thinned]
    assert steps == sorted(set(steps)) and steps[-1] == 299 and len(steps) < 200, steps
    by_step = {r["step"]: r for r in full}
    for record in thinned:  # each facet it has equal to the full trace's at that step
        same = by_step[record["step"]]
        assert all(record[facet] == same[facet] for facet in record if facet != "unfinished"), record["step"]
    assert [r["step"] for r in full if r.get("unfinished")] == list(failing)
    assert 201 not in steps  # (odd: past step 128 a thinned trace records multiples of a power of two)
    assert all(r.get("unfinished") == by_step[r["step"]].get("unfinished") for r in thinned)
