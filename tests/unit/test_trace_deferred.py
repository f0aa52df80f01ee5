"""The step trace with every facet every step on an accelerator: fingerprints are left on the
device and read when the trace is written, so the host never waits for the device at a step. Run on
CPU tensors routed through the accelerator's path (`InPlaceHashes.in_place_device`), in a
subprocess (the tracer's hooks are process-wide)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

PROGRAM = """
import json, random, sys, torch
from pathlib import Path
from cascade_repro.child.step_tensors import FACETS, Deferred
from cascade_repro.child.trace import StepTracer
from cascade_repro.determinism import fingerprint

fingerprint.InPlaceHashes.in_place_device = "none"  # every tensor takes the accelerator's path
out, defer = Path(sys.argv[1]), sys.argv[2] == "defer"
tracer = StepTracer(torch, out / "trace.jsonl", grads=True, budget=0.0)  # trace: full
assert tracer.tensors.defer  # the tracer's choice where it reads every facet every step
tracer.tensors.defer = defer
tracer.install()
torch.manual_seed(0)
random.seed(0)  # Python's and numpy's states are in the trace too
if "numpy" in sys.modules:
    sys.modules["numpy"].random.seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 5), torch.nn.Tanh(), torch.nn.Linear(5, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
x, y = torch.randn(16, 8), torch.randn(16, 1)
after, held = {}, 0
for step in range(6):
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()
    after[step] = fingerprint.device_checksums(torch, [model[2].weight])[0]  # read now, by hand
    held += sum(isinstance(r.get(f), Deferred) for r in tracer._writer._unwritten for f in FACETS)
tracer.close()
(out / "facts.json").write_text(json.dumps({"after": after, "held": held}))
"""


def _trace(tmp_path: Path, mode: str) -> tuple[str, dict[str, Any]]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    program = [sys.executable, "-c", textwrap.dedent(PROGRAM), str(tmp_path), mode]
    subprocess.run(program, check=True, timeout=120)
    return (tmp_path / "trace.jsonl").read_text(), json.loads((tmp_path / "facts.json").read_text())


def test_fingerprints_left_on_the_device_are_written_as_if_read_at_each_step(tmp_path: Path) -> None:
    deferred, facts = _trace(tmp_path / "deferred", "defer")
    at_once, facts_at_once = _trace(tmp_path / "at-once", "now")
    assert facts["held"] > 0 and facts_at_once["held"] == 0  # records waited in the writer, unread
    assert deferred == at_once  # the same trace, byte for byte
    records = [json.loads(line) for line in deferred.splitlines()]
    assert [r["step"] for r in records] == list(range(6))
    # each step's weights as they were after it, not as they were when the trace was written
    assert [r["params_after"]["2.weight"] for r in records] == [facts["after"][str(s)] for s in range(6)]
    assert len({r["params_after"]["2.weight"] for r in records}) == 6
    assert all(set(r["grads"]) == {"0.weight", "0.bias", "2.weight", "2.bias"} for r in records)
