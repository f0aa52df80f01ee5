"""The step trace at very short steps (~0.1 ms on CPU; a small model on a fast GPU), where what is
left is the hooks' own calls at the steps the budget gave no record.

Each variant runs in a fresh process (the trace's hooks cannot be taken out of torch once in), in
turns, best of REPEATS: no hook at all; the same four entry points hooked by functions that do
nothing (the least any tracer hooked there costs: an optimizer step pre- and post-hook, a wrapper
of `torch.autograd.backward` and of `DataLoader.__iter__`); cascade's tracer at the default budget.
Before any figure, the trace is checked: its records are the steps its own schedule names.
Reported (no target of its own: the issue's is "a trace within 2 % at any step size").
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

from common import ROOT

REPEATS = 5
STEPS = 4096

PROGRAM = textwrap.dedent(
    """
    import json, sys, tempfile, time
    from pathlib import Path
    import torch
    torch.set_num_threads(1)
    variant, out = sys.argv[1], Path(sys.argv[2])
    if variant == "trace":
        from cascade_repro.child.trace import StepTracer
        tracer = StepTracer(torch, out / "trace.jsonl", budget=0.02)
        tracer.install()
    elif variant == "empty hooks":
        import importlib, torch.autograd, torch.utils.data
        optim = importlib.import_module("torch.optim.optimizer")
        optim.register_optimizer_step_pre_hook(lambda optimizer, args, kwargs: None)
        optim.register_optimizer_step_post_hook(lambda optimizer, args, kwargs: None)
        original_backward, original_iter = torch.autograd.backward, torch.utils.data.DataLoader.__iter__
        def backward(tensors, *args, **kwargs):
            return original_backward(tensors, *args, **kwargs)
        def iterate(self):
            for batch in original_iter(self):
                yield batch
        torch.autograd.backward, torch.utils.data.DataLoader.__iter__ = backward, iterate
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.utils.data.TensorDataset(torch.randn(STEPS, 8), torch.randn(STEPS, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=1)
    def epoch():
        for x, y in loader:
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
    epoch()  # warms up (and the trace's first FULL_RECORDS steps, recorded whole, are behind it)
    best = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        epoch()
        best = min(best, time.perf_counter() - started)
    result = {"step_s": best / STEPS}
    if variant == "trace":
        tracer.close()
        result["header"] = tracer.header()
    (out / "result.json").write_text(json.dumps(result))
    """
).replace("STEPS", str(STEPS))

VARIANTS = ("no hooks", "empty hooks", "trace")


def run(variant: str) -> dict:  # type: ignore[type-arg]
    out = Path(tempfile.mkdtemp(prefix="cascade-bench-"))
    subprocess.run([sys.executable, "-c", PROGRAM, variant, str(out)], check=True, cwd=ROOT, timeout=600)
    result = json.loads((out / "result.json").read_text())
    if variant == "trace":
        check_trace(out / "trace.jsonl", result["header"])
    return result  # type: ignore[no-any-return]


def check_trace(path: Path, header: dict) -> None:  # type: ignore[type-arg]
    """The records are exactly the steps the trace's records schedule names, the last step's weights
    after them: a tracer that had turned itself off would cost nothing."""
    from cascade_repro.child.trace_budget import SamplingBudget, parse_schedule

    schedule = parse_schedule(header.get("records"))
    if schedule is None:
        sys.exit(f"the trace's header has no records schedule: {header}")
    total = 4 * STEPS  # four epochs traced
    named = SamplingBudget(0.02, records=schedule)
    expected = [s for s in range(total) if named.records_step(s)]
    steps = [json.loads(line)["step"] for line in path.read_text().splitlines() if line.strip()]
    if steps[: len(expected)] != expected or steps[len(expected) :] not in ([], [total - 1]):
        sys.exit(f"the trace recorded {len(steps)} steps, not the {len(expected)} its schedule names")


def main() -> None:
    times: dict[str, list[float]] = {name: [] for name in VARIANTS}
    header: dict = {}  # type: ignore[type-arg]
    for i in range(REPEATS):
        for name in VARIANTS[i % 3 :] + VARIANTS[: i % 3]:  # in turns: this machine's speed drifts
            result = run(name)
            times[name].append(result["step_s"])
            header = result.get("header", header)
    bare = min(times["no hooks"])
    print(f"{'step time, no hooks':32}: {bare * 1e6:.1f} us (a Linear(8, 1) at batch 1, best of {REPEATS})")
    for name in VARIANTS[1:]:
        best = min(times[name])
        extra = (best - bare) * 1e6
        print(f"{name:32}: {best * 1e6:.1f} us, +{extra:.1f} us a step, ratio {best / bare:.3f}")
    cost = header.get("cost", {})
    records = header.get("records")
    print(f"the trace's records schedule    : {records} ([step, every] from it on)")
    print(f"the trace, as it measured itself: {cost.get('share', 0):.2%} of the loop (the hooks' calls at "
          "steps without a record are not in it)")


if __name__ == "__main__":
    main()
