"""The step tracer inside a real torch process (a subprocess: its hooks are process-wide)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

PROGRAM = """
import json, sys, torch
from pathlib import Path
from cascade_repro.child.trace import StepTracer
from cascade_repro.determinism.fingerprint import cpu_hash

out = Path(sys.argv[1]); hidden = int(sys.argv[2]); grads = json.loads(sys.argv[3])
torch.set_num_threads(1)  # two processes compared bit for bit: a BLAS free to pick its threads by load is not
headers = []
tracer = StepTracer(torch, out / "trace.jsonl", grads=grads, on_header=headers.append)
tracer.install()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(16, 8), torch.randn(16, 1)
seen, losses = {}, []
for step in range(4):
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    losses.append(loss.item())
    loss.backward()
    if step == 2:  # between this step's backward and its optimizer step: part of step 2
        with torch.no_grad():
            model[2].bias.add_(1.0)
    opt.step()
    loss.detach().fill_(-7.0)  # the script reuses the loss's memory once the step is over
    if step == 1:  # after the optimizer step, before the next backward: part of step 1
        model[2].weight.data[0, 0] += 1.0
    seen[step] = cpu_hash(model[2].weight)
def closure():
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    return loss
opt.step(closure)  # step 4: its backward runs inside the step, after the step's pre-hook
seen[4] = cpu_hash(model[2].weight)
tracer.close()
facts = {"seen": seen, "losses": losses, "headers": headers, "final": tracer.header()}
(out / "seen.json").write_text(json.dumps(facts))
"""


def _trace(tmp_path: Path, hidden: int, grads: bool | None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [sys.executable, "-c", textwrap.dedent(PROGRAM), str(tmp_path), str(hidden), json.dumps(grads)],
        check=True, timeout=120,
    )  # fmt: skip
    records = [json.loads(line) for line in (tmp_path / "trace.jsonl").read_text().splitlines()]
    return records, json.loads((tmp_path / "seen.json").read_text())


def test_params_after_step_k_are_the_weights_when_step_k_plus_1_begins(tmp_path: Path) -> None:
    records, facts = _trace(tmp_path, hidden=4, grads=None)
    assert [r["step"] for r in records] == [0, 1, 2, 3, 4]
    after = [r["params_after"]["2.weight"] for r in records]
    assert after == [facts["seen"][str(step)] for step in range(5)]  # the script's own hash after each step
    assert all(r["loss"]["dtype"] == "float32" and isinstance(r["loss"]["bits"], int) for r in records)
    # step 4 ran a closure: its loss and gradients are the closure's, not step 3's
    assert records[4]["loss"] != records[3]["loss"] and records[4]["grads"] != records[3]["grads"]


def test_gradients_are_hashed_where_cheap(tmp_path: Path) -> None:
    small, facts = _trace(tmp_path / "small", hidden=4, grads=None)
    assert all(set(r["grads"]) == {"0.weight", "0.bias", "2.weight", "2.bias"} for r in small)
    assert facts["headers"][0]["grads"] is True and "where cheap" in facts["headers"][0]["grads_rule"]
    # 8*5000 + 5000 + 5000 + 1 floats ≈ 200 KB: still cheap; 40000 hidden units ≈ 1.9 MB is not
    big, facts = _trace(tmp_path / "big", hidden=40_000, grads=None)
    assert all(r["grads"] is None for r in big)
    # told once when the first step decides, and at the end with what the trace cost
    decided, ended = facts["headers"]
    assert decided == {k: v for k, v in ended.items() if k != "cost"} and facts["final"]["grads"] is False
    assert ended == facts["final"] and ended["cost"]["share"] > 0
    forced, facts = _trace(tmp_path / "forced", hidden=40_000, grads=True)
    assert all(len(r["grads"]) == 4 for r in forced) and facts["headers"] == [facts["final"]]
    # what is hashed does not change the parameters' fingerprints
    assert [r["params_after"] for r in big] == [r["params_after"] for r in forced]


def test_loss_bits_are_the_float_bits(tmp_path: Path) -> None:
    import struct

    records, facts = _trace(tmp_path, hidden=4, grads=False)
    assert len(facts["losses"]) == 4
    for record, seen in zip(records, facts["losses"], strict=False):  # steps 0-3: the script's own losses
        loss = record["loss"]
        assert loss["value"] == seen and loss["bits"] == struct.unpack("<i", struct.pack("<f", seen))[0]


BUDGETED = """
import json, sys, torch
from pathlib import Path
from cascade_repro.child.trace import StepTracer

out, budget, schedule = Path(sys.argv[1]), float(sys.argv[2]), json.loads(sys.argv[3])
tracer = StepTracer(torch, out / "trace.jsonl", grads=True, budget=budget,
                    schedule=None if schedule is None else [tuple(e) for e in schedule])
tracer.install()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.Tanh(), torch.nn.Linear(256, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(40):
    x, y = torch.randn(32, 64), torch.randn(32, 1)
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()
tracer.close()
(out / "header.json").write_text(json.dumps(tracer.header()))
"""


Traced = tuple[list[dict[str, Any]], dict[str, Any]]


def _budgeted(tmp_path: Path, budget: float, schedule: list[list[int]] | None = None) -> Traced:
    tmp_path.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-c", textwrap.dedent(BUDGETED), str(tmp_path), str(budget),
                    json.dumps(schedule)], check=True, timeout=120)  # fmt: skip
    records = [json.loads(line) for line in (tmp_path / "trace.jsonl").read_text().splitlines()]
    return records, json.loads((tmp_path / "header.json").read_text())


def test_a_tiny_budget_reads_the_weights_at_the_first_and_last_steps_only(tmp_path: Path) -> None:
    records, header = _budgeted(tmp_path, 1e-9)
    assert [r["step"] for r in records] == list(range(40))  # the cheap facets every step
    assert all(r["rng"] and r["batch"] is None and r["loss"]["bits"] is not None for r in records)
    sampled = [r["step"] for r in records if "params_after" in r]
    # step 0 (the schedule starts at every step) and step 1 (before a step time is known), then none
    # until the final weights at exit
    assert sampled == [0, 1, 39], sampled
    assert [r["step"] for r in records if "grads" in r] == [0, 1]
    assert (header["budget"], header["sampled"]) == (1e-9, ["grads", "params_after"])
    assert header["schedule"] == [[0, 1], [2, 1024]]  # from step 2 on, every 1024th step


def test_a_schedule_handed_back_samples_the_same_steps(tmp_path: Path) -> None:
    records, header = _budgeted(tmp_path, 0.02, [[0, 1], [3, 8], [20, 2]])
    assert [r["step"] for r in records if "params_after" in r] == [0, 1, 2, 8, 16, 20, 22, 24, 26, 28, 30,
                                                                    32, 34, 36, 38, 39]  # fmt: skip
    assert header["schedule"] == [[0, 1], [3, 8], [20, 2]]


def test_budget_zero_reads_every_facet_every_step(tmp_path: Path) -> None:
    records, header = _budgeted(tmp_path, 0.0)
    assert all("params_after" in r and r["grads"] for r in records) and len(records) == 40
    assert "budget" not in header and "sampled" not in header


BIG_BATCHES = """
import json, sys, torch
from pathlib import Path
from cascade_repro.child.trace import StepTracer

out = Path(sys.argv[1])
tracer = StepTracer(torch, out / "trace.jsonl", budget=0.02)
tracer.install()
weight = torch.nn.Parameter(torch.zeros(1))
opt = torch.optim.SGD([weight], lr=0.01)
batch = torch.rand(4 << 20)  # 16 MB, yielded as it is (no collate): hashing it is most of a step
for x in torch.utils.data.DataLoader([batch] * 12, batch_size=None):
    opt.zero_grad()
    (weight * x[0]).sum().backward()
    opt.step()
tracer.close()
(out / "header.json").write_text(json.dumps(tracer.header()))
"""


def test_the_batch_fingerprint_counts_in_what_the_trace_costs(tmp_path: Path) -> None:
    """The budget sees everything the trace does every step: a batch it fingerprints as well."""
    subprocess.run([sys.executable, "-c", textwrap.dedent(BIG_BATCHES), str(tmp_path)], check=True,
                   timeout=120)  # fmt: skip
    records = [json.loads(line) for line in (tmp_path / "trace.jsonl").read_text().splitlines()]
    assert len(records) == 12 and len({r["batch"] for r in records}) == 1
    cost = json.loads((tmp_path / "header.json").read_text())["cost"]
    # a tiny step beside the pass over 16 MB: the fingerprint is most of the loop's time
    assert cost["every_step"] > 0.3, cost


SLOW_SETUP = """
import io, json, sys, time, torch
from pathlib import Path
from cascade_repro.child import step_values
from cascade_repro.child.trace import StepTracer

out, closure = Path(sys.argv[1]), sys.argv[2] == "closure"
tracer = StepTracer(torch, out / "trace.jsonl", budget=0.02)
tracer.install()
buffer = io.BytesIO()
torch.save(torch.nn.Linear(2, 1), buffer)  # unpickled: named by a scan of every live object ...
model = torch.load(io.BytesIO(buffer.getvalue()), weights_only=False)
live = [[] for _ in range(2_000_000)]  # ... of which there are many
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(4, 2)
def loss():
    opt.zero_grad()
    value = model(x).sum()
    value.backward()
    return value
for step in range(30):
    if closure:  # the names looked up in the first optimizer step's pre-hook
        opt.step(loss)
    else:  # at the first backward, before any optimizer step
        loss()
        opt.step()
tracer.close()
started = time.perf_counter()
step_values.named_parameters(torch)
scan_ms = 1000 * (time.perf_counter() - started)
(out / "cost.json").write_text(json.dumps({**tracer.header()["cost"], "scan_ms": scan_ms}))
"""


@pytest.mark.parametrize("order", ["backward first", "closure"])
def test_what_the_first_step_does_once_is_setup_not_a_steps_cost(tmp_path: Path, order: str) -> None:
    subprocess.run([sys.executable, "-c", textwrap.dedent(SLOW_SETUP), str(tmp_path), order.split()[0]],
                   check=True, timeout=120)  # fmt: skip
    cost = json.loads((tmp_path / "cost.json").read_text())
    assert cost["setup_ms"] > cost["scan_ms"] / 2, cost  # the scan at step 0 ...
    spent_in_steps_ms = cost["every_step"] * cost["step_ms"] * 29
    assert spent_in_steps_ms < cost["scan_ms"] / 2, cost  # ... is in no step's cost


CRASHING = """
import json, sys, torch
from pathlib import Path
from cascade_repro.child.trace import StepTracer

tracer = StepTracer(torch, Path(sys.argv[1]) / "trace.jsonl", grads=False)
tracer.install()
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)

class Failing(torch.optim.SGD):
    def step(self, closure=None):
        if self.state.get("calls", 0) == 2:
            raise RuntimeError("the optimizer failed")
        self.state["calls"] = self.state.get("calls", 0) + 1
        return super().step(closure)

opt = Failing(model.parameters(), lr=0.1)
losses = []
try:
    for step in range(4):
        opt.zero_grad()
        loss = model(torch.ones(2, 4)).square().mean()
        losses.append(loss.item())
        loss.backward()
        opt.step()
finally:
    tracer.close()
    (Path(sys.argv[1]) / "losses.json").write_text(json.dumps(losses))
"""


def test_a_step_whose_optimizer_failed_keeps_its_loss(tmp_path: Path) -> None:
    # the loss is read when the optimizer step returns; one that never returns has it read at exit
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(CRASHING), str(tmp_path)],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 1 and "the optimizer failed" in done.stderr
    records = [json.loads(line) for line in (tmp_path / "trace.jsonl").read_text().splitlines()]
    steps = [r for r in records if "step" in r]
    losses = json.loads((tmp_path / "losses.json").read_text())
    assert [r["step"] for r in steps] == [0, 1, 2]
    assert [r["loss"]["value"] for r in steps] == losses[:3]
    assert "params_after" in steps[2]  # the final weights, read at exit


STOPPED = """
import sys, torch
from pathlib import Path
from cascade_repro.child.trace import StepTracer
tracer = StepTracer(torch, Path(sys.argv[1]) / "trace.jsonl")
tracer.install()
model = torch.nn.Linear(2, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(6):
    opt.zero_grad()
    model(torch.ones(1, 2)).sum().backward()
    opt.step()
    if step == 1:
        tracer.stop(OSError(28, "No space left on device"))  # as a flush on a full disk stops it
    print(tracer.last_step())
"""


def test_a_stopped_trace_still_counts_the_steps_a_checkpoint_is_saved_at(tmp_path: Path) -> None:
    """Found on HF Trainer with a full run directory: once the trace stopped (at step 4), the saves at
    steps 7, 11 and 15 were all recorded at step 4: the step count stopped with the trace."""
    done = subprocess.run([sys.executable, "-c", STOPPED, str(tmp_path)], capture_output=True, text=True,
                          check=True, timeout=120)  # fmt: skip
    assert done.stdout.split() == ["0", "1", "2", "3", "4", "5"]
