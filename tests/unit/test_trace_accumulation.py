"""Gradient accumulation: a step that trains on several batches, a backward() each. The step's
record holds all of them: its batch fingerprint covers every batch it trained on (a change in the
first is that step's, not "the same batch, another gradient"), and its loss is the sum of the
losses backpropagated, each one's bits kept. A loader iterated between steps without training
(validation) does not leak into the next step's batch. Found on the HF Trainer and Accelerate with
gradient_accumulation_steps=2: the record held the last micro-batch only, and `verify` blamed
nondeterministic computation for a changed first micro-batch."""

from __future__ import annotations

import json
import struct
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

out, change, records = Path(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3])
tracer = StepTracer(torch, out / "trace.jsonl", budget=0.0 if records is None else 0.02,
                    schedule=None if records is None else [(0, 1)],
                    records=None if records is None else [tuple(e) for e in records])
tracer.install()
torch.manual_seed(0), random.seed(0), numpy.random.seed(0)  # (their states are in the records too)
x, y = torch.randn(128, 4), torch.randn(128, 1)
if "first micro-batch of step 5" in change:
    x[80] += 1.0  # in batch 10 of 8 rows: the first of step 5's two
xv = torch.randn(16, 4)
if change == "validation data":
    xv += 1.0
collate, made = None, []
if change.startswith("objects"):  # each step's second micro-batch as Python lists, no tensor
    def collate(rows):
        made.append(1)
        xs, ys = torch.stack([r[0] for r in rows]), torch.stack([r[1] for r in rows])
        return (xs, ys) if len(made) % 2 else (xs.tolist(), ys.tolist())
train = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=8, collate_fn=collate)
val = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(xv), batch_size=8)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
losses, parts, step = [], [], 0
try:
    for i, (xb, yb) in enumerate(train):  # two batches a step, a backward each
        xb, yb = torch.as_tensor(xb), torch.as_tensor(yb)
        loss = torch.nn.functional.mse_loss(model(xb), yb) / 2
        loss.backward()
        parts.append(loss.item())
        if i % 2 == 0:
            continue
        if change == "killed" and step == 6:
            raise KeyboardInterrupt  # after the step's backwards, before its optimizer step
        opt.step()
        opt.zero_grad()
        losses.append(parts)
        parts, step = [], step + 1
        with torch.no_grad():  # validation between steps: no backward
            for (xv_batch,) in val:
                model(xv_batch)
except KeyboardInterrupt:
    pass
tracer.close()
(out / "losses.json").write_text(json.dumps(losses))
"""


def _run(tmp_path: Path, change: str, records: list[list[int]] | None = None) -> list[dict[str, Any]]:
    out = tmp_path / change.replace(" ", "-")
    out.mkdir(parents=True, exist_ok=True)
    program = textwrap.dedent(PROGRAM)
    subprocess.run([sys.executable, "-c", program, str(out), change, json.dumps(records)],
                   check=True, timeout=120)  # fmt: skip
    return [json.loads(line) for line in (out / "trace.jsonl").read_text().splitlines()]


def _losses(tmp_path: Path, change: str) -> list[list[float]]:
    return json.loads((tmp_path / change.replace(" ", "-") / "losses.json").read_text())  # type: ignore[no-any-return]


def _float32_bits(value: float) -> int:
    return struct.unpack("<i", struct.pack("<f", value))[0]


def test_a_step_s_batch_covers_every_batch_it_trained_on(tmp_path: Path) -> None:
    plain = _run(tmp_path, "none")
    changed = _run(tmp_path, "first micro-batch of step 5")
    assert [r["step"] for r in plain] == list(range(8)) and all(r["batch"] for r in plain)
    first = next(r["step"] for r, c in zip(plain, changed, strict=True) if r["batch"] != c["batch"])
    assert first == 5
    assert all(r["batch"] == c["batch"] for r, c in zip(plain[:5], changed[:5], strict=True))
    assert all(r["batches"] == 2 for r in plain)  # (a trace from before said neither: trace_formats.py)


def test_a_micro_batch_without_tensors_adds_nothing_to_its_step_s_batch(tmp_path: Path) -> None:
    """It made the step's batch none: a step whose second micro-batch is Python lists recorded no batch,
    and a change in its first went unseen."""
    plain = _run(tmp_path, "objects")
    changed = _run(tmp_path, "objects, first micro-batch of step 5")
    assert all(r["batch"] is not None and "batches" not in r for r in plain)
    first = next(r["step"] for r, c in zip(plain, changed, strict=True) if r["batch"] != c["batch"])
    assert first == 5


def test_a_loader_iterated_between_steps_without_training_leaves_the_batches_alone(tmp_path: Path) -> None:
    plain = _run(tmp_path, "none")
    other_validation = _run(tmp_path, "validation data")
    assert [r["batch"] for r in other_validation] == [r["batch"] for r in plain]
    assert other_validation == plain


def test_a_step_s_loss_is_the_sum_of_its_backpropagated_losses_with_each_one_s_bits(tmp_path: Path) -> None:
    records = _run(tmp_path, "none")
    script = _losses(tmp_path, "none")
    assert len(script) == 8
    for record, parts in zip(records, script, strict=True):
        assert record["loss"]["bits"] == [_float32_bits(p) for p in parts]
        assert record["loss"]["value"] == sum(parts)
        assert record["loss"]["parts"] == 2


def test_a_run_ended_between_a_step_s_backward_and_its_optimizer_keeps_the_last_step_s_loss(
    tmp_path: Path,
) -> None:
    """Ctrl-C after step 6's backwards: the final weights' record is step 5's, with step 5's loss
    (not none, which made `show --trace` end the loss curve on an earlier recorded step)."""
    records = _run(tmp_path, "killed", records=[[0, 1], [3, 8]])
    script = _losses(tmp_path, "killed")
    assert len(script) == 6 and [r["step"] for r in records] == [0, 1, 2, 5]
    assert records[-1]["loss"]["bits"] == [_float32_bits(p) for p in script[5]]


ACCELERATE = """
import json, sys, torch
from pathlib import Path
from cascade_repro.child.trace import StepTracer

out, change = Path(sys.argv[1]), sys.argv[2]
tracer = StepTracer(torch, out / "trace.jsonl", budget=0.0)
tracer.install()
from accelerate import Accelerator

accelerator = Accelerator(cpu=True, gradient_accumulation_steps=2)
x = torch.randn(96, 8, generator=torch.Generator().manual_seed(0))
y = x.sum(1, keepdim=True)
if change == "first micro-batch of step 2":
    x[64, 0] += 1.0  # batch 4 of 16 rows: the first of step 2's two
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
model, opt, loader = accelerator.prepare(model, opt, torch.utils.data.DataLoader(
    torch.utils.data.TensorDataset(x, y), batch_size=16))
for xb, yb in loader:
    with accelerator.accumulate(model):
        accelerator.backward(torch.nn.functional.mse_loss(model(xb), yb))
        opt.step()
        opt.zero_grad()
tracer.close()
"""


def test_accelerate_s_accumulation_over_a_loader_fetching_ahead(tmp_path: Path) -> None:
    """Accelerate's own accumulation (its DataLoaderShard fetches one ahead): 6 batches, 3 steps."""
    pytest.importorskip("accelerate", reason="accelerate is not installed (`make install-dev` installs it)")
    traces = {}
    for change in ("none", "first micro-batch of step 2"):
        out = tmp_path / change.replace(" ", "-")
        out.mkdir()
        subprocess.run([sys.executable, "-c", textwrap.dedent(ACCELERATE), str(out), change],
                       check=True, timeout=180)  # fmt: skip
        traces[change] = [json.loads(line) for line in (out / "trace.jsonl").read_text().splitlines()]
    plain, changed = traces["none"], traces["first micro-batch of step 2"]
    assert [r["step"] for r in plain] == [0, 1, 2]
    assert all(r["loss"]["parts"] == 2 for r in plain)
    assert [r["batch"] == c["batch"] for r, c in zip(plain, changed, strict=True)] == [True, True, False]


IN_THE_CLOSURE = """
import json, sys, torch
from pathlib import Path
from cascade_repro.child.trace import StepTracer

out = Path(sys.argv[1])
tracer = StepTracer(torch, out / "trace.jsonl", budget=0.0)
tracer.install()
torch.manual_seed(0)
x, y = torch.randn(32, 4), torch.randn(32, 1)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
losses = []
for k in range(0, 32, 16):  # Lightning's automatic optimization with accumulate_grad_batches=2:
    first = torch.nn.functional.mse_loss(model(x[k:k + 8]), y[k:k + 8]) / 2
    first.backward()  # the first micro-batch outside the optimizer step,

    def closure():  # the last inside it, in the closure the optimizer calls
        loss = torch.nn.functional.mse_loss(model(x[k + 8:k + 16]), y[k + 8:k + 16]) / 2
        loss.backward()
        return loss

    last = opt.step(closure)
    opt.zero_grad()
    losses.append([first.item(), last.item()])
tracer.close()
(out / "losses.json").write_text(json.dumps(losses))
"""


def test_a_micro_batch_trained_in_the_optimizer_s_closure_adds_to_the_step_s_loss(tmp_path: Path) -> None:
    """Lightning runs the stepping micro-batch inside `optimizer.step(closure)`: that backward was taken
    for a closure evaluated again and replaced the step's losses ("loss last" was half the logged
    train_loss). A closure evaluated again (LBFGS) still keeps only its last (tests/unit/test_trace.py)."""
    subprocess.run([sys.executable, "-c", textwrap.dedent(IN_THE_CLOSURE), str(tmp_path)], check=True,
                   timeout=120)  # fmt: skip
    records = [json.loads(line) for line in (tmp_path / "trace.jsonl").read_text().splitlines()]
    script = json.loads((tmp_path / "losses.json").read_text())
    assert [r["step"] for r in records] == [0, 1]
    for record, parts in zip(records, script, strict=True):
        assert record["loss"]["bits"] == [_float32_bits(p) for p in parts]
        assert record["loss"]["value"] == sum(parts)
