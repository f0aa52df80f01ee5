"""The losses a step backpropagates in forms other than `loss.backward()`: several at once through
`torch.autograd.backward([loss_a, loss_b])` (a multi-task model) are the step's loss, their sum with each
one's bits kept, as for gradient accumulation. They were not recorded: `show --trace` had no loss and a
changed auxiliary loss went unnamed."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

PROGRAM = """
import json, sys, torch
from pathlib import Path
from cascade_repro.child.trace import StepTracer

out = Path(sys.argv[1])
tracer = StepTracer(torch, out / "trace.jsonl", budget=0.0)
tracer.install()
torch.manual_seed(0)
x, y = torch.randn(64, 4), torch.randn(64, 1)
trunk, head_a, head_b = torch.nn.Linear(4, 8), torch.nn.Linear(8, 1), torch.nn.Linear(8, 1)
params = [*trunk.parameters(), *head_a.parameters(), *head_b.parameters()]
opt = torch.optim.SGD(params, lr=0.1)
losses = []
for step in range(5):
    features = torch.relu(trunk(x))
    main = torch.nn.functional.mse_loss(head_a(features), y)
    auxiliary = head_b(features).abs().mean() * float(sys.argv[2])
    torch.autograd.backward([main, auxiliary])
    losses.append([main.item(), auxiliary.item()])
    opt.step()
    opt.zero_grad()
tracer.close()
(out / "losses.json").write_text(json.dumps(losses))
"""


def _run(tmp_path: Path, weight: str) -> tuple[list[dict[str, Any]], list[list[float]]]:
    out = tmp_path / weight
    out.mkdir()
    program = textwrap.dedent(PROGRAM)
    subprocess.run([sys.executable, "-c", program, str(out), weight], check=True, timeout=120)
    records = [json.loads(line) for line in (out / "trace.jsonl").read_text().splitlines()]
    return records, json.loads((out / "losses.json").read_text())


def _float32_bits(value: float) -> int:
    return struct.unpack("<i", struct.pack("<f", value))[0]


def test_losses_backpropagated_together_are_the_step_s_loss_with_each_one_s_bits(tmp_path: Path) -> None:
    records, script = _run(tmp_path, "0.5")
    assert [r["step"] for r in records] == list(range(5))
    for record, (main, auxiliary) in zip(records, script, strict=True):
        assert record["loss"]["bits"] == [_float32_bits(main), _float32_bits(auxiliary)]
        assert record["loss"]["parts"] == 2 and record["loss"]["value"] == main + auxiliary


def test_a_changed_auxiliary_loss_differs_at_step_zero(tmp_path: Path) -> None:
    plain, _ = _run(tmp_path, "0.5")
    other, _ = _run(tmp_path, "0.25")
    assert plain[0]["loss"]["bits"][0] == other[0]["loss"]["bits"][0]  # the main loss: the same weights
    assert plain[0]["loss"]["bits"][1] != other[0]["loss"]["bits"][1]
