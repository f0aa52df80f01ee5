"""The tensors a replay saves (child/trace_dump.py): each step of the range, within a byte cap."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import torch

from cascade_repro.child.trace_dump import not_saved, step_file
from cascade_repro.determinism.fingerprint import cpu_hash

SCRIPT = """
import sys, torch
from pathlib import Path
from cascade_repro.child.trace import StepTracer
from cascade_repro.child.trace_dump import TensorDump

out, max_bytes = Path(sys.argv[1]), int(sys.argv[2])
tracer = StepTracer(torch, out / "trace.jsonl", grads=True)
tracer.dump = TensorDump(torch, 3, 7, out / "saved", max_bytes=max_bytes)
tracer.install()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(10):
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(torch.randn(4, 8)), torch.randn(4, 1)).backward()
    opt.step()
tracer.close()
"""


def _traced(tmp_path: Path, max_bytes: int) -> tuple[list[dict], Path]:
    subprocess.run([sys.executable, "-c", textwrap.dedent(SCRIPT), str(tmp_path), str(max_bytes)],
                   check=True, timeout=120)  # fmt: skip
    records = [json.loads(line) for line in (tmp_path / "trace.jsonl").read_text().splitlines()]
    return records, tmp_path / "saved"


def test_every_step_of_the_range_is_saved_and_is_the_traced_step(tmp_path: Path) -> None:
    records, saved = _traced(tmp_path, 1 << 30)
    assert sorted(p.parent.name for p in saved.rglob("*.pt")) == [f"step{n}" for n in range(3, 8)]
    for step in range(3, 8):
        tensors = torch.load(step_file(saved, step), weights_only=True)
        assert set(tensors) == {"params_before", "grads", "params_after"}
        # the saved tensors are the ones the trace fingerprinted at that step
        record = records[step]
        assert {n: cpu_hash(t) for n, t in tensors["params_after"].items()} == record["params_after"]
        assert {n: cpu_hash(t) for n, t in tensors["grads"].items()} == record["grads"]
        before = {n: cpu_hash(t) for n, t in tensors["params_before"].items()}
        assert before == records[step - 1]["params_after"]  # one step's after is the next one's before


def test_past_the_cap_only_the_last_step_is_saved(tmp_path: Path) -> None:
    _, saved = _traced(tmp_path, 1)  # the first step's file is over it already
    assert sorted(p.parent.name for p in saved.rglob("*.pt")) == ["step3", "step7"]


def test_a_step_that_cannot_be_saved_stops_the_saving_not_the_trace(tmp_path: Path) -> None:
    # a real OSError: the folder step 5 saves into is taken by a file
    saved = tmp_path / "saved"
    saved.mkdir()
    (saved / "step5").write_text("in the way")
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(SCRIPT), str(tmp_path), str(1 << 30)],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    assert "cascade: the tensors of step 5 could not be saved to" in done.stderr
    assert "bytes free on its disk" in done.stderr and "the replay goes on without saving" in done.stderr
    # the steps before it are saved, none after it, and the trace has every step
    assert sorted(p.parent.name for p in saved.rglob("*.pt")) == ["step3", "step4"]
    records = [json.loads(line) for line in (tmp_path / "trace.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "step" in r] == list(range(10))
    assert all("params_after" in r for r in records if "step" in r)
    assert not_saved(saved) is not None and not_saved(saved).startswith("the tensors of step 5 could not")
