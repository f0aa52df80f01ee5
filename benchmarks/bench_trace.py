"""Per-step trace cost on the reference MLP (~1.9M params, CPU), and verification cost per step.

Targets (DESIGN.md): step time with the trace on / off ≤ 1.03, beside hashing the same tensors
(parameters and gradients) with hashlib md5 and sha256 in the same process; verification time per
step / step time ≤ 0.001.

The tracer is cascade's own (`cascade_repro.child.trace.StepTracer`, as `cascade run` installs
it); its hooks are switched on and off between interleaved blocks so that every variant sees the
same machine state.
"""

from __future__ import annotations

import hashlib
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from cascade_repro.child.trace import StepTracer
from cascade_repro.determinism.verdict import judge

BLOCKS, STEPS = 12, 25


def main() -> None:
    for batch in (64, 256):
        print(f"-- batch {batch}")
        measure(batch)


def measure(batch: int) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(784, 1024),
        torch.nn.ReLU(),
        torch.nn.Linear(1024, 1024),
        torch.nn.ReLU(),
        torch.nn.Linear(1024, 10),
    )
    params = list(model.parameters())
    opt = torch.optim.SGD(params, lr=0.01, momentum=0.9)
    x, y = torch.randn(batch, 784), torch.randint(0, 10, (batch,))
    trace_path = Path(tempfile.mkdtemp(prefix="cascade-bench-")) / "trace.jsonl"
    tracer = StepTracer(torch, trace_path)
    tracer.install()
    lean = StepTracer(torch, trace_path.with_name("lean.jsonl"), grads=False)  # trace_grads: false
    lean.install()

    def hashlib_all(name: str) -> None:
        for tensor in [*params, *(p.grad for p in params)]:
            hashlib.new(name, tensor.detach().numpy().tobytes()).digest()

    variants = {"off": None, "trace": None, "lean": None, "md5": "md5", "sha256": "sha256"}
    times: dict[str, list[float]] = {name: [] for name in variants}
    for block in range(BLOCKS + 1):
        for name, algorithm in variants.items():
            tracer._closed = name != "trace"  # the tracers' own off switch
            lean._closed = name != "lean"
            started = time.perf_counter()
            for _ in range(STEPS):
                opt.zero_grad()
                loss = torch.nn.functional.cross_entropy(model(x), y)
                loss.backward()
                opt.step()
                if algorithm:
                    hashlib_all(algorithm)
            if block:  # block 0 warms up
                times[name].append((time.perf_counter() - started) / STEPS)
    tracer._closed = False
    tracer.close()
    lean._closed = True

    step = statistics.median(times["off"])
    print(f"parameters                      : {sum(p.numel() for p in params):,}")
    print(f"step time, no trace             : {step * 1e3:.2f} ms")
    labels = {
        "trace": "cascade trace (params + grads)",
        "lean": "cascade trace, trace_grads: false",
        "md5": "hashlib md5, params + grads",
        "sha256": "hashlib sha256, params + grads",
    }
    for name in ("trace", "lean", "md5", "sha256"):
        ratio = statistics.median(times[name]) / step
        label = labels[name]
        ok = "meets target)" if ratio <= 1.03 else "MISSES target)"
        target = f"  (target <= 1.03: {ok}" if name in ("trace", "lean") else ""
        print(f"{label:32}: ratio {ratio:.3f}{target}")

    records = [json.loads(line) for line in trace_path.read_text().splitlines() if line.strip()]
    manifest = {"run_id": "a", "trace": {"algorithm": "xxh3_64", "interval": 1}}
    started = time.perf_counter()
    rounds = 20
    for _ in range(rounds):
        judge(manifest, {**manifest, "run_id": "b"}, records, [dict(r) for r in records])
    per_step = (time.perf_counter() - started) / rounds / len(records)
    ratio = per_step / step
    ok = "meets target" if ratio <= 0.001 else "MISSES target"
    print(
        f"verification per step           : {per_step * 1e6:.1f} us over {len(records)} steps; "
        f"/ step time {ratio:.5f} (target <= 0.001: {ok})"
    )


if __name__ == "__main__":
    main()
