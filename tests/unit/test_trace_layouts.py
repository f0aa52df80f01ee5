"""The step tracer on what real training code feeds it besides dense CPU tensors: sparse embedding
gradients, sparse batches, and a batch it cannot read (a nested tensor) (in a subprocess: the hooks are
process-wide)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

PROGRAM = """
import json, sys, torch
from pathlib import Path
from cascade_repro.child.trace import StepTracer
from cascade_repro.determinism.fingerprint import cpu_hash

out, unreadable = Path(sys.argv[1]), sys.argv[2] == "unreadable"
tracer = StepTracer(torch, out / "trace.jsonl", grads=True)
tracer.install()
torch.manual_seed(0)


class Tokens(torch.utils.data.Dataset):
    def __len__(self):
        return 8
    def __getitem__(self, i):
        return torch.tensor([i % 5, (i + 1) % 5, (i + 3) % 5])


def collate(items):  # the tokens, and a sparse mask of them (a graph's adjacency, a bag of words)
    tokens = torch.stack(items)
    mask = torch.zeros(len(items), 5).index_fill_(1, tokens[0], 1.0).to_sparse()
    # a nested tensor (sequences of several lengths) has no one shape to read: its fingerprint fails
    extra = [torch.nested.nested_tensor([torch.ones(2), torch.ones(3)])] if unreadable else []
    return [tokens, mask, *extra]


model = torch.nn.Sequential(torch.nn.Embedding(5, 4, sparse=True), torch.nn.Flatten(), torch.nn.Linear(12, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
seen = []
for tokens, mask, *_ in torch.utils.data.DataLoader(Tokens(), batch_size=2, collate_fn=collate):
    opt.zero_grad()
    (model(tokens).sum() + mask.to_dense().sum()).backward()
    seen.append({"grad": cpu_hash(model[0].weight.grad), "mask": cpu_hash(mask)})
    opt.step()
tracer.close()
(out / "seen.json").write_text(json.dumps(seen))
"""


def _run(tmp_path: Path, mode: str) -> tuple[subprocess.CompletedProcess[str], list[dict], list[dict]]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    program = [sys.executable, "-c", textwrap.dedent(PROGRAM), str(tmp_path), mode]
    done = subprocess.run(program, capture_output=True, text=True, timeout=120)
    trace = tmp_path / "trace.jsonl"
    records = [json.loads(line) for line in trace.read_text().splitlines()] if trace.exists() else []
    seen = json.loads((tmp_path / "seen.json").read_text()) if done.returncode == 0 else []
    return done, [r for r in records if "step" in r], seen


def test_sparse_embedding_gradients_and_sparse_batches_are_traced(tmp_path: Path) -> None:
    done, steps, seen = _run(tmp_path, "sparse")
    assert done.returncode == 0 and "trace stopped" not in done.stderr, done.stderr
    assert [r["step"] for r in steps] == [0, 1, 2, 3]
    # the embedding's sparse gradient, as the script saw it at each step
    assert [r["grads"]["0.weight"] for r in steps] == [s["grad"] for s in seen]
    assert len({r["grads"]["0.weight"] for r in steps}) == 4
    assert len({r["batch"] for r in steps}) == 4 and all(r["batch"] for r in steps)


def test_a_batch_the_trace_cannot_read_stops_the_trace_not_the_training(tmp_path: Path) -> None:
    done, steps, seen = _run(tmp_path, "unreadable")
    assert done.returncode == 0, done.stderr  # the training ran to its end
    assert len(seen) == 4
    # its fingerprint fails as the loader yields it, before step 0 is recorded: the trace stops, once
    assert done.stderr.count("cascade: the step trace stopped at step 0") == 1, done.stderr
    assert "NestedTensorImpl" in done.stderr and steps == []
