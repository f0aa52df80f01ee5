"""Mixed precision's loss scaling (`torch.amp.GradScaler`): the script backpropagates
`scaler.scale(loss)`, and `scaler.step(opt)` skips `opt.step()` where the gradients hold an inf or a
NaN. The record holds the user's loss (the tensor handed to `scale`, its exact bits), not the scaled
one (a curve multiplied by a scale that changes over the run); a skipped step is a step of its own,
marked `"skipped": true`, so the steps keep the script's iterations' numbers. Found on a script whose
loss read 1.52 and whose record read 99596.17, and whose skipped step was merged with the next as if
it were gradient accumulation, every later step numbered one less. In a subprocess: the hooks are
process-wide."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from cascade_repro.determinism.trace_file import TraceRecords
from cascade_repro.errors import CascadeError

PROGRAM = """
import json, sys, torch
from pathlib import Path
from cascade_repro.child.trace import StepTracer

out, scenario = Path(sys.argv[1]), sys.argv[2]
budget = 0.02 if scenario == "thinned" else 0.0
tracer = StepTracer(torch, out / "trace.jsonl", budget=budget,
                    schedule=[(0, 1)] if budget else None, records=[(0, 1), (2, 2)] if budget else None)
tracer.install()
torch.manual_seed(0)
x, y = torch.randn(64, 4), torch.randn(64, 1)
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=8)
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
scaler = torch.amp.GradScaler("cpu", init_scale=1024)
losses, scales = [], []
for i, (xb, yb) in enumerate(loader):
    loss = torch.nn.functional.mse_loss(model(xb), yb)
    if i in (0, 3):
        loss = loss * 1e36  # finite in float32; times the scale, inf: the scaler skips the step
    losses.append(loss.detach().view(torch.int32).item())
    scales.append(scaler.get_scale())
    opt.zero_grad()
    if scenario == "list":
        torch.autograd.backward(scaler.scale([loss]))
    else:
        scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
tracer.close()
print(json.dumps({"losses": losses, "scales": scales}))
"""


def _run(tmp_path: Path, scenario: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(PROGRAM), str(tmp_path), scenario],
                          check=True, capture_output=True, text=True, timeout=120)  # fmt: skip
    text = (tmp_path / "trace.jsonl").read_text()
    records = TraceRecords.from_text(text)  # every record valid as the readers check them
    return [records[i] for i in range(len(records))], json.loads(done.stdout.splitlines()[-1])


def test_the_record_holds_the_users_loss_and_a_skipped_step_is_a_step_of_its_own(tmp_path: Path) -> None:
    records, script = _run(tmp_path, "plain")
    assert script["scales"][:5] == [1024.0, 512.0, 512.0, 512.0, 256.0]  # steps 0 and 3 skipped
    assert [r["step"] for r in records] == list(range(8))  # the script's iterations
    assert [r["loss"]["bits"] for r in records] == script["losses"]  # the loss handed to `scale`, exactly
    assert all("parts" not in r["loss"] and "batches" not in r for r in records)
    assert [r.get("skipped", False) for r in records] == [True, False, False, True] + [False] * 4
    # a skipped step updates nothing: its weights after are those before it
    assert records[0]["params_after"] == records[0]["params_before"]
    assert records[3]["params_after"] == records[2]["params_after"]
    assert records[4]["params_after"] != records[3]["params_after"]
    assert len({r["batch"] for r in records}) == 8  # each step its own batch


def test_a_skipped_step_without_a_record_is_still_counted(tmp_path: Path) -> None:
    records, script = _run(tmp_path, "thinned")  # records at steps 0, 1, then every 2nd
    assert [r["step"] for r in records] == [0, 1, 2, 4, 6, 7]  # (7: the final weights)
    assert [r.get("skipped", False) for r in records] == [True] + [False] * 5
    assert [r["loss"]["bits"] for r in records] == [script["losses"][r["step"]] for r in records]


def test_scaled_losses_in_a_list_still_count_each_step(tmp_path: Path) -> None:
    records, _ = _run(tmp_path, "list")  # (a list backpropagated: no loss read, as without a scaler)
    assert [r["step"] for r in records] == list(range(8))
    assert [r.get("skipped", False) for r in records] == [True, False, False, True] + [False] * 4


def test_a_record_marked_skipped_is_valid_and_a_mark_of_another_kind_is_not() -> None:
    record = {"step": 3, "rng": None, "batch": None, "loss": None, "skipped": True}
    assert TraceRecords([json.dumps(record)])[0]["skipped"] is True
    with pytest.raises(CascadeError, match="skipped"):
        TraceRecords([json.dumps({**record, "skipped": "yes"})])[0]
