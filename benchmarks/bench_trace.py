"""Per-step trace cost on the reference MLP (~1.9M params, CPU), and verification cost per step.

Targets (issue 17): step time with the default trace (a 2 % budget) / off ≤ 1.02 at batch 64 and
256; with every facet every step (`trace: full`) ≤ 1.05 at batch 64, the time inside the hooks
beside the cost of reading the weights once; beside hashing the same tensors with hashlib md5 and
sha256 in the same process; verification time per step / step time ≤ 0.001.

The tracer is cascade's own (`cascade_repro.child.trace.StepTracer`, as `cascade run` installs
it); its hooks are switched on and off between interleaved blocks so that every variant sees the
same machine state. Three tracers: the default (budget 0.02, gradients "where cheap": this model's
7.5 MB of gradients on CPU are not), `trace: full` (budget 0: the weights every step) and
`trace_grads: true` with it (parameters and gradients every step).
Besides the wall-time ratio (noisy on a shared 2-core machine) it prints the time spent inside
the tracer's hooks per step, the direct cost, which is steadier. `--device cuda` runs the same on a
GPU (benchmarks/gpu_check.sh; the device's queue is drained before each clock read).
"""

from __future__ import annotations

import hashlib
import json
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from cascade_repro.child.trace import StepTracer
from cascade_repro.child.trace_budget import SamplingBudget
from cascade_repro.determinism.fingerprint import InPlaceHashes
from cascade_repro.determinism.trace_file import TraceRecords
from cascade_repro.determinism.verdict import judge
from cascade_repro.manifest import Manifest
from cascade_repro.settings import DEFAULT_TRACE_BUDGET

BLOCKS, STEPS = 16, 25
DEVICE = sys.argv[sys.argv.index("--device") + 1] if "--device" in sys.argv else "cpu"


def now() -> float:
    """The clock, once the device has done what was asked of it."""
    if DEVICE != "cpu":
        torch.cuda.synchronize()
    return time.perf_counter()
HOOKS = ("_before_step", "_after_step", "_guarded_next_step_begins")


def main() -> None:
    batches = [int(sys.argv[sys.argv.index("--batch") + 1])] if "--batch" in sys.argv else [64, 256]
    for batch in batches:
        print(f"-- batch {batch}")
        measure(batch)


def timed_tracer(path: Path, grads: bool | None, budget: float) -> tuple[StepTracer, list[float]]:
    """A tracer whose hook methods add their time to spent[0] (wrapped before install())."""
    tracer = StepTracer(torch, path, grads=grads, budget=budget)
    spent = [0.0]
    for name in HOOKS:
        original = getattr(tracer, name)

        def timed(*args: Any, original: Any = original) -> Any:
            started = time.perf_counter()
            try:
                return original(*args)
            finally:
                spent[0] += time.perf_counter() - started

        setattr(tracer, name, timed)
    tracer.install()
    return tracer, spent


def where_the_trace_reads(model: Any, opt: Any, x: Any, y: Any, read: Any) -> float:
    """What `read()` takes between a step's forward and its backward, where the trace reads the
    weights (the step before has just written them: they come from memory as much as from cache)."""
    took = []
    for _ in range(41):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        started = now()
        read()
        took.append(now() - started)
        loss.backward()
        opt.step()
    return statistics.median(took[1:])


def read_every_byte(params: list[Any]) -> None:
    for p in params:
        p.detach().sum()  # every byte read once (torch's threads, all of them)


def measure(batch: int) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(784, 1024),
        torch.nn.ReLU(),
        torch.nn.Linear(1024, 1024),
        torch.nn.ReLU(),
        torch.nn.Linear(1024, 10),
    ).to(DEVICE)
    params = list(model.parameters())
    opt = torch.optim.SGD(params, lr=0.01, momentum=0.9)
    x, y = torch.randn(batch, 784, device=DEVICE), torch.randint(0, 10, (batch,), device=DEVICE)
    trace_path = Path(tempfile.mkdtemp(prefix="cascade-bench-")) / "trace.jsonl"
    tracers = {
        "trace": timed_tracer(trace_path, grads=None, budget=DEFAULT_TRACE_BUDGET),  # the default
        "full": timed_tracer(trace_path.with_name("full.jsonl"), grads=None, budget=0.0),  # trace: full
        "grads": timed_tracer(trace_path.with_name("grads.jsonl"), grads=True, budget=0.0),  # trace_grads
    }

    def hashlib_all(name: str, with_grads: bool) -> None:
        for tensor in [*params, *((p.grad for p in params) if with_grads else ())]:
            hashlib.new(name, tensor.detach().cpu().numpy().tobytes()).digest()

    variants: dict[str, tuple[str, bool] | None] = {
        "off": None, "trace": None, "full": None, "grads": None,
        "md5": ("md5", False), "sha256": ("sha256", False),
        "md5+g": ("md5", True), "sha256+g": ("sha256", True),
    }  # fmt: skip
    times: dict[str, list[float]] = {name: [] for name in variants}
    inside: dict[str, list[float]] = {name: [] for name in tracers}
    order = list(variants.items())
    for block in range(BLOCKS + 1):
        # each block starts with another variant: none always follows the same one (the hashlib
        # variants evict the cache the next one starts with; the clock drifts within a block)
        for name, competitor in order[block % len(order):] + order[:block % len(order)]:
            for tracer_name, (tracer, spent) in tracers.items():
                tracer.closed = name != tracer_name  # the tracers' own off switch ...
                tracer.coasting = False  # ... (and a tracer coasting between records counts no foreign step)
                spent[0] = 0.0
                # the other variants' blocks are not this tracer's steps (a pause it skips too)
                tracer.sampling._last_start = None
            started = now()
            for _ in range(STEPS):
                opt.zero_grad()
                loss = torch.nn.functional.cross_entropy(model(x), y)
                loss.backward()
                opt.step()
                if competitor:
                    hashlib_all(*competitor)
            if block:  # block 0 warms up
                times[name].append((now() - started) / STEPS)
                if name in tracers:
                    inside[name].append(tracers[name][1][0] / STEPS)
    for tracer, _ in tracers.values():
        tracer.closed = False
        tracer.close()
    # A tracer that had turned itself off would cost nothing: count what each wrote before any ratio.
    traced = (BLOCKS + 1) * STEPS
    for name, (tracer, _) in tracers.items():
        path = trace_path if name == "trace" else trace_path.with_name(f"{name}.jsonl")
        lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        steps = [r for r in lines if "step" in r and r.get("loss")]
        weights = [r for r in steps if "params_after" in r]
        with_grads = [r for r in steps if r.get("grads")]
        # the default thins its records where its budget needs it (the header's schedule says which)
        scheduled = SamplingBudget(0.02, records=tracer.sampling.records) if name == "trace" else None
        expected = sum(1 for s in range(traced) if scheduled is None or scheduled.records_step(s))
        every_step = name != "trace"  # the default samples the weights as its budget allows
        if len(steps) < expected - 1 or (every_step and len(weights) < expected - 1) or not weights \
                or (name == "grads" and len(with_grads) < expected - 1):  # fmt: skip
            sys.exit(f"the {name} tracer wrote {len(steps)} step records ({len(weights)} with weights, "
                     f"{len(with_grads)} with gradients); {expected} of {traced} steps were to have "
                     "one")  # fmt: skip
        print(f"{name + ' records written':32}: {len(steps)} of {traced} steps ({len(weights)} with weights, "
              f"{len(with_grads)} with gradients)")  # fmt: skip
    read_once = where_the_trace_reads(model, opt, x, y, lambda: read_every_byte(params))

    step = statistics.median(times["off"])
    print(f"parameters                      : {sum(p.numel() for p in params):,}")
    print(f"step time, no trace             : {step * 1e3:.2f} ms")
    share_once = read_once / step * 100
    print(f"reading the weights once        : {read_once * 1e3:.3f} ms ({share_once:.1f}% of a step; a sum "
          "over them on every core, between a forward and a backward)")  # fmt: skip
    hashes = InPlaceHashes(torch)
    hashed = where_the_trace_reads(model, opt, x, y, lambda: hashes(params))
    print(f"their fingerprints alone        : {hashed * 1e3:.3f} ms ({hashed / step * 100:.1f}% of a step; "
          "one call, between a forward and a backward as the trace takes them)")
    labels = {
        "trace": "cascade trace (default: 2% budget)",
        "full": "cascade trace, trace: full",
        "grads": "cascade trace, full + trace_grads",
        "md5": "hashlib md5, params",
        "sha256": "hashlib sha256, params",
        "md5+g": "hashlib md5, params + grads",
        "sha256+g": "hashlib sha256, params + grads",
    }
    for name, label in labels.items():
        ratio = statistics.median(times[name]) / step
        extra = ""
        if name in tracers:
            share = statistics.median(inside[name]) / step
            target = {"trace": 1.02, "full": 1.05 if batch == 64 else None}.get(name)
            ok = "reported" if target is None else "meets target" if ratio <= target else "MISSES target"
            extra = f"  (target <= {target}: {ok}" if target else f"  ({ok}"
            extra += f"; inside the hooks {share * 100:.1f}% of a step)"
        print(f"{label:32}: ratio {ratio:.3f}{extra}")

    with_grads = trace_path.with_name("grads.jsonl")  # every facet: the most to compare
    text = with_grads.read_text()
    records = [json.loads(line) for line in text.splitlines() if line.strip()]
    manifest = Manifest("a", "bench", trace={"algorithm": "xxh3_64", "interval": 1})
    rounds = 20
    # as `cascade verify` reads two traces (their text, records parsed where the text differs), and
    # the worst case: every record parsed and compared facet by facet (records as dicts)
    as_read = lambda: (TraceRecords.from_text(text), TraceRecords.from_text(text))  # noqa: E731
    as_dicts = lambda: (records, [dict(r) for r in records])  # noqa: E731
    for label, sides in (("verification per step", as_read), ("... every facet compared", as_dicts)):
        started = time.perf_counter()
        for _ in range(rounds):
            a, b = sides()
            verdict = judge(manifest, replace(manifest, run_id="b"), a, b)
        if verdict.verdict != "BITWISE_IDENTICAL":
            sys.exit(f"a trace judged against itself: {verdict.verdict}")
        per_step = (time.perf_counter() - started) / rounds / len(records)
        ratio = per_step / step
        ok = "meets target" if ratio <= 0.001 else "MISSES target"
        print(f"{label:32}: {per_step * 1e6:.2f} us over {len(records)} steps; / step time {ratio:.5f} "
              f"(target <= 0.001: {ok})")  # fmt: skip


if __name__ == "__main__":
    main()
