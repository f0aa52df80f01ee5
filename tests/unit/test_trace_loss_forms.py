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

# Each program runs after this: the tracer installed as the child installs it, every facet every step.
HEADER = """
import json, sys, torch
from pathlib import Path
from cascade_repro.child.trace import StepTracer

out = Path(sys.argv[1])
tracer = StepTracer(torch, out / "trace.jsonl", budget=0.0)
tracer.install()
torch.manual_seed(0)
"""

TWO_HEADS = """
x, y = torch.randn(64, 4), torch.randn(64, 1)
trunk, head_a, head_b = torch.nn.Linear(4, 8), torch.nn.Linear(8, 1), torch.nn.Linear(8, 1)
params = [*trunk.parameters(), *head_a.parameters(), *head_b.parameters()]
opt = torch.optim.SGD(params, lr=0.1)
losses = []
"""

PROGRAM = TWO_HEADS + """for step in range(5):
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


def _traced(tmp_path: Path, name: str, program: str, *args: str) -> tuple[list[dict[str, Any]], Any]:
    """`program` run with the tracer: its step records, and the losses it wrote itself."""
    out = tmp_path / name
    out.mkdir()
    script = HEADER + textwrap.dedent(program)
    subprocess.run([sys.executable, "-c", script, str(out), *args], check=True, timeout=120)
    records = [json.loads(line) for line in (out / "trace.jsonl").read_text().splitlines()]
    return [r for r in records if "step" in r], json.loads((out / "losses.json").read_text())


def _run(tmp_path: Path, weight: str) -> tuple[list[dict[str, Any]], list[list[float]]]:
    return _traced(tmp_path, weight, PROGRAM, weight)


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


NESTED = """

class Lookahead(torch.optim.Optimizer):  # as timm's: steps its base optimizer inside its own step
    def __init__(self, base, k=2, alpha=0.5):
        self.base, self.k, self.alpha, self.n = base, k, alpha, 0
        self.param_groups, self.state, self.defaults = base.param_groups, base.state, base.defaults
        self.slow = [p.detach().clone() for g in self.param_groups for p in g["params"]]
        self._optimizer_step_pre_hooks, self._optimizer_step_post_hooks = {}, {}

    def step(self, closure=None):
        loss = self.base.step(closure)
        self.n += 1
        if self.n % self.k == 0:
            with torch.no_grad():
                for s, p in zip(self.slow, [p for g in self.param_groups for p in g["params"]]):
                    s.add_(p - s, alpha=self.alpha)
                    p.copy_(s)
        return loss


model = torch.nn.Linear(4, 1)
x = torch.randn(32, 4)
opt = Lookahead(torch.optim.SGD(model.parameters(), lr=0.05))
losses = []
for i in range(6):
    loss = torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
    opt.zero_grad()
    loss.backward()
    opt.step()
    losses.append(loss.item())
tracer.close()
(out / "losses.json").write_text(json.dumps(losses))
"""


def test_an_optimizer_stepped_inside_another_s_step_is_one_step(tmp_path: Path) -> None:
    """timm's Lookahead steps its base optimizer inside its own step(): both are torch optimizers, and
    every iteration was counted twice (steps 0, 0, 2, 2, ...; half the records without a loss)."""
    steps, script = _traced(tmp_path, "nested", NESTED)
    assert [r["step"] for r in steps] == list(range(6))
    assert [r["loss"]["bits"] for r in steps] == [_float32_bits(loss) for loss in script]
    assert all(r.get("params_after") for r in steps)


SAM = """
model = torch.nn.Linear(4, 1)
x = torch.randn(32, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
losses = []
for i in range(6):  # SAM: a backward, the weights moved up the gradient, a second backward, restored
    first = torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
    first.backward()
    with torch.no_grad():
        old = [p.clone() for p in model.parameters()]
        for p in model.parameters():
            p.add_(p.grad * 0.01)
    opt.zero_grad()
    second = torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
    second.backward()
    with torch.no_grad():
        for p, o in zip(model.parameters(), old):
            p.copy_(o)
    opt.step()
    opt.zero_grad()
    losses.append([first.item(), second.item()])
tracer.close()
(out / "losses.json").write_text(json.dumps(losses))
"""


def test_weights_perturbed_between_two_backwards_before_the_first_step_are_no_manual_update(
    tmp_path: Path,
) -> None:
    """SAM moves the weights between its two backward() calls, then steps its optimizer: before the
    first step that looked like a script updating weights by hand, and the first iteration was split
    in two records (steps 0, 1, 1, 2, ...: every later step numbered one too high)."""
    steps, script = _traced(tmp_path, "sam", SAM)
    assert [r["step"] for r in steps] == list(range(6))
    assert [r["loss"]["bits"] for r in steps] == [[_float32_bits(a), _float32_bits(b)] for a, b in script]


IN_A_CLOSURE = TWO_HEADS + """

def closure():
    opt.zero_grad()
    features = torch.relu(trunk(x))
    main = torch.nn.functional.mse_loss(head_a(features), y)
    auxiliary = head_b(features).abs().mean() * 0.5
    torch.autograd.backward([main, auxiliary])
    losses.append([main.item(), auxiliary.item()])
    return main + auxiliary


for step in range(4):
    opt.step(closure)
tracer.close()
(out / "losses.json").write_text(json.dumps(losses))
"""


def test_losses_backpropagated_together_in_an_optimizer_closure_are_all_the_step_s(tmp_path: Path) -> None:
    """Inside a closure (LBFGS, SAM's step(closure), Lightning's automatic optimization) each loss of
    `autograd.backward([a, b])` replaced the one before: the step's loss was `b` alone."""
    records, script = _traced(tmp_path, "closure", IN_A_CLOSURE)
    assert [r["step"] for r in records] == list(range(4))
    for record, (main, auxiliary) in zip(records, script, strict=True):
        assert record["loss"]["bits"] == [_float32_bits(main), _float32_bits(auxiliary)]
