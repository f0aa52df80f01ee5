"""A loader that fetches one batch ahead (Accelerate's DataLoaderShard, so the HF Trainer's) hands the
training loop batch k while the DataLoader has already yielded batch k+1. Step k's record must still
hold batch k: the same trace, byte for byte, as the plain loop over the same data
(child/trace_install.py). Tried on Accelerate 1.16 itself: every step's batch was the next one's
before, the one it trained on now."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from cascade_repro.child import step_values

PROGRAM = """
import json, random, sys, numpy, torch
from pathlib import Path
from cascade_repro.child.trace import StepTracer

out, loop, records = Path(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3])
budget = 0.0 if records is None else 0.02
tracer = StepTracer(torch, out / "trace.jsonl", grads=True, budget=budget,
                    schedule=None if records is None else [(0, 1)],
                    records=None if records is None else [tuple(e) for e in records])
tracer.install()
torch.manual_seed(0), random.seed(0), numpy.random.seed(0)  # (their states are in the records too)
data = torch.utils.data.TensorDataset(torch.randn(120, 4), torch.randn(120, 1))
loader = torch.utils.data.DataLoader(data, batch_size=8, shuffle=True)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)

def one_ahead(iterable):  # Accelerate's DataLoaderShard: the next batch fetched before one is handed out
    iterator = iter(iterable)
    current = next(iterator)
    while True:
        try:
            following = next(iterator)
        except StopIteration:
            yield current
            return
        yield current
        current = following

def step(x, y):
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()

for epoch in range(3):  # 15 steps an epoch: the last batch of each is handed out after the loader ended
    if loop == "accumulating":  # two batches a step, a backward for each: no batch fetched ahead
        batches = iter(loader)
        for x, y in batches:
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            x, y = next(batches, (x, y))
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
        continue
    for x, y in (one_ahead(loader) if loop == "one ahead" else loader):
        step(x, y)
tracer.close()
"""


def _trace(tmp_path: Path, loop: str, records: list[list[int]] | None) -> list[dict[str, object]]:
    out = tmp_path / loop.replace(" ", "-")
    out.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-c", textwrap.dedent(PROGRAM), str(out), loop, json.dumps(records)],
                   check=True, timeout=120)  # fmt: skip
    return [json.loads(line) for line in (out / "trace.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("records", [None, [[0, 1], [3, 4]]], ids=["every step", "records thinned"])
def test_a_loader_fetching_one_ahead_records_the_batch_each_step_trained_on(
    tmp_path: Path, records: list[list[int]] | None
) -> None:
    plain = _trace(tmp_path, "plain", records)
    ahead = _trace(tmp_path, "one ahead", records)
    assert len(plain) > 10 and all(r.get("batch") for r in plain if "loss" in r)
    assert [r["step"] for r in ahead] == [r["step"] for r in plain]
    assert [r.get("batch") for r in ahead] == [r.get("batch") for r in plain]
    assert ahead == plain  # every facet: the same training, the same trace


def test_two_batches_a_step_with_a_backward_each_is_no_fetching_ahead(tmp_path: Path) -> None:
    """Gradient accumulation takes two batches before a step, each trained on at once: the step's
    batch covers both, in order (no batch handed out late). The plain loop trains on the same
    batches one a step."""
    records = _trace(tmp_path, "accumulating", None)
    plain = [r["batch"] for r in _trace(tmp_path, "plain", None) if "loss" in r]
    assert len(records) == 24 and len(plain) == 45  # 8 steps an epoch (the last takes one batch), 3 epochs
    expected = []
    for epoch in range(3):
        order = plain[15 * epoch : 15 * epoch + 15]
        expected += [step_values.joined(order[k : k + 2]) for k in range(0, 14, 2)] + [order[14]]
    assert [r["batch"] for r in records] == expected


ACCELERATE = """
import json, sys, torch
from pathlib import Path
from cascade_repro.child import step_values
from cascade_repro.child.trace import StepTracer

out = Path(sys.argv[1])
tracer = StepTracer(torch, out / "trace.jsonl", budget=0.0)
tracer.install()
from accelerate import Accelerator

accelerator = Accelerator(cpu=True)
x = torch.randn(96, 8, generator=torch.Generator().manual_seed(0))
y = x.sum(1, keepdim=True)
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
model, opt, loader = accelerator.prepare(model, opt, torch.utils.data.DataLoader(
    torch.utils.data.TensorDataset(x, y), batch_size=16))
for epoch in range(2):
    for xb, yb in loader:
        opt.zero_grad()
        accelerator.backward(torch.nn.functional.mse_loss(model(xb), yb))
        opt.step()
tracer.close()
rows = [slice(16 * (k % 6), 16 * (k % 6) + 16) for k in range(12)]  # in order, 6 batches an epoch
own = [step_values.batch_fingerprint(torch, [x[r], y[r]], {}) for r in rows]
(out / "batches.json").write_text(json.dumps(own))
"""


def test_accelerates_loader_has_each_step_record_its_own_batch(tmp_path: Path) -> None:
    """Accelerate's DataLoaderShard itself (what the HF Trainer iterates): 2 epochs of 6 batches in
    order, each step's record the fingerprint of the batch it trained on."""
    pytest.importorskip("accelerate", reason="accelerate is not installed (`make install-dev` installs it)")
    program = textwrap.dedent(ACCELERATE)
    subprocess.run([sys.executable, "-c", program, str(tmp_path)], check=True, timeout=180)
    records = [json.loads(line) for line in (tmp_path / "trace.jsonl").read_text().splitlines()]
    own = json.loads((tmp_path / "batches.json").read_text())
    assert [r["step"] for r in records] == list(range(12))
    assert [r["batch"] for r in records] == own
