"""The step trace with every facet every step on an accelerator: fingerprints (of the weights, the
gradients, the batches) are left on the device and read when the trace is written, so the host
never waits for the device at a step. Run on
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
from cascade_repro.child import step_values
from cascade_repro.child.step_tensors import FACETS, Deferred
from cascade_repro.child.trace import StepTracer
from cascade_repro.determinism import fingerprint

fingerprint.InPlaceHashes.in_place_device = "none"  # every tensor takes the accelerator's path
out, defer = Path(sys.argv[1]), sys.argv[2] == "defer"
tracer = StepTracer(torch, out / "trace.jsonl", grads=True, budget=0.0)  # trace: full
assert tracer.tensors.defer  # the tracer's choice where it reads every facet every step
tracer.tensors.defer = defer
if not defer:
    tracer.batch_sums = None  # batches read at once too
tracer.install()
torch.manual_seed(0)
random.seed(0)  # Python's and numpy's states are in the trace too
if "numpy" in sys.modules:
    sys.modules["numpy"].random.seed(0)


class Samples(torch.utils.data.Dataset):  # dict batches: not the list-of-CPU-tensors fast path
    def __init__(self):
        self.x, self.y = torch.randn(16, 8), torch.randn(16, 1)
    def __len__(self):
        return 16
    def __getitem__(self, i):
        return {"x": self.x[i], "y": self.y[i]}


model = torch.nn.Sequential(torch.nn.Linear(8, 5), torch.nn.Tanh(), torch.nn.Linear(5, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
loader = torch.utils.data.DataLoader(Samples(), batch_size=5)  # 5, 5, 5, then 1: another layout
after, batches, held, held_batches = {}, {}, 0, 0
step = 0
for epoch in range(2):
    for batch in loader:
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(batch["x"]), batch["y"]).backward()
        opt.step()
        # read now, by hand
        after[step] = fingerprint.device_checksums(torch, [model[2].weight])[0]
        batches[step] = step_values.joined(fingerprint.device_checksums(torch, [batch["x"], batch["y"]]))
        waiting = tracer._writer._unwritten
        held += sum(isinstance(r.get(f), Deferred) for r in waiting for f in FACETS)
        held_batches += sum(isinstance(r.get("batch"), fingerprint.Later) for r in waiting)
        step += 1
tracer.close()
facts = {"after": after, "batches": batches, "held": held, "held_batches": held_batches}
(out / "facts.json").write_text(json.dumps(facts))
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
    assert facts["held_batches"] > 0 and facts_at_once["held_batches"] == 0
    assert deferred == at_once  # the same trace, byte for byte
    records = [json.loads(line) for line in deferred.splitlines()]
    assert [r["step"] for r in records] == list(range(8))
    # each step's weights as they were after it, not as they were when the trace was written
    assert [r["params_after"]["2.weight"] for r in records] == [facts["after"][str(s)] for s in range(8)]
    assert len({r["params_after"]["2.weight"] for r in records}) == 8
    # and the batch each step trained on (dicts of tensors on the "device", the last one shorter)
    assert [r["batch"] for r in records] == [facts["batches"][str(s)] for s in range(8)]
    assert len({r["batch"] for r in records}) == 4  # the same four batches in both epochs
    assert all(set(r["grads"]) == {"0.weight", "0.bias", "2.weight", "2.bias"} for r in records)


UNREADABLE = """
import json, sys, torch
from pathlib import Path
from cascade_repro.child import trace_writer
from cascade_repro.child.trace import StepTracer
from cascade_repro.determinism import fingerprint

fingerprint.InPlaceHashes.in_place_device = "none"  # every tensor takes the accelerator's path
tracer = StepTracer(torch, Path(sys.argv[1]) / "trace.jsonl", budget=0.0)
tracer.install()
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.randn(8, 4)
for step in range(5):
    opt.zero_grad()
    model(x).sum().backward()
    opt.step()
    if step == 2:
        tracer._writer.flush()  # steps 0 and 1 are in the file


def unreadable(torch, records):  # what a CUDA error in the script leaves: nothing on the device reads
    raise RuntimeError("CUDA error: an illegal memory access was encountered")


trace_writer.settle = unreadable
"""


def test_a_device_that_can_no_longer_be_read_at_exit_leaves_the_trace_written_so_far(tmp_path: Path) -> None:
    # (a mock: a sticky CUDA error cannot be produced without a GPU) the tracer closes at exit
    program = [sys.executable, "-c", textwrap.dedent(UNREADABLE) + "tracer.close()\n", str(tmp_path)]
    done = subprocess.run(program, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "cascade: the step trace stopped at step 5: RuntimeError('CUDA error" in done.stderr
    assert "Traceback" not in done.stderr
    records = [json.loads(line) for line in (tmp_path / "trace.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "step" in r] == [0, 1]
    assert all(len(r["params_after"]["weight"]) == 32 for r in records if "step" in r)
