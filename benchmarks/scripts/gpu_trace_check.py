"""The trace's half of a run on a GPU, checked in one short run where only torch is installed (the
lent GPU machine has no MLflow or DVC; the recorder's half is tested in CI): benchmarks/gpu_check.sh.

1. the stack as the child reads it (GPU, CUDA, cuDNN, NCCL, TF32 and determinism flags);
2. device checksums equal the same sums over the CPU copy, see one ulp, and run under
   `torch.use_deterministic_algorithms(True)` (`--deterministic strict`) without an error;
3. a seeded CUDA training traced twice (every facet, every step) writes the same trace, line for
   line, and another seed differs from step 0; the fingerprints of the weights and of the batches
   (on the device), left there until the trace is written, are those read at each step;
4. under the default budget, what a sampled step's fingerprints are timed at is their own cost, not
   the work the step queued on the device before them (which the copy back would wait for).
The step-time ratios come from `bench_trace.py --device cuda`. Exit 1 when a check fails. `--cpu`
runs it on CPU tensors (to try the script without a GPU).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # before CUDA starts: deterministic cuBLAS
import torch  # noqa: E402

from cascade_repro.child import step_values  # noqa: E402
from cascade_repro.child.torch_probe import torch_stack  # noqa: E402
from cascade_repro.child.trace import StepTracer  # noqa: E402
from cascade_repro.determinism import device_checksum  # noqa: E402
from cascade_repro.determinism.device_checksum import DeviceChecksums  # noqa: E402
from cascade_repro.determinism.fingerprint import InPlaceHashes  # noqa: E402

DEVICE = "cpu" if "--cpu" in sys.argv else "cuda"


def mlp() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Linear(784, 1024), torch.nn.ReLU(), torch.nn.Dropout(0.1),
        torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 10),
    )  # fmt: skip


def train(path: str, seed: int, steps: int = 30) -> None:
    """One seeded training, traced with every facet every step (run in its own process)."""
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(seed)  # and Python's and numpy's generators, which the trace reads too (as cascade run)
    random.seed(seed)
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed(seed)
    if DEVICE == "cpu":  # trying the script: CPU tensors take the accelerator's path too
        InPlaceHashes.in_place_device = "none"
    tracer = StepTracer(torch, Path(path), grads=True, budget=0.0)
    tracer.install()
    model = mlp().to(DEVICE)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, y = torch.randn(160, 784, device=DEVICE), torch.randint(0, 10, (160,), device=DEVICE)
    # batches that live on the device, the last of each epoch shorter (another layout)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=48, shuffle=True)
    last = list(model.parameters())[-1]
    read_at_once = []  # the last layer's bias after each step and the batch, copied back at once
    while len(read_at_once) < steps:
        for xb, yb in loader:
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(xb), yb).backward()
            opt.step()
            batch = step_values.batch_fingerprint(torch, [xb, yb])  # no kept checksums: read now
            read_at_once.append([DeviceChecksums(torch)([last])[0], batch])
    tracer.close()
    Path(path).with_suffix(".after.json").write_text(json.dumps(read_at_once))


def budgeted(path: str) -> None:
    """Train under the default budget with heavy work queued before each backward; print what the
    budget was told each sampled step's fingerprints took, beside the time of that queued work."""
    tracer = StepTracer(torch, Path(path), budget=0.02)
    timed: list[float] = []
    told = tracer.sampling.hashed
    tracer.sampling.hashed = lambda seconds: (timed.append(seconds), told(seconds))[1]  # type: ignore[method-assign]
    tracer.install()
    size = 4096 if DEVICE == "cuda" else 512  # (on CPU nothing is queued: a try of the script)
    heavy = torch.randn(size, size, device=DEVICE)
    model = torch.nn.Linear(64, 64).to(DEVICE)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(64, 64, device=DEVICE)

    def queue_heavy_work() -> None:
        for _ in range(8):
            heavy @ heavy

    for _ in range(30):
        opt.zero_grad()
        queue_heavy_work()  # before the step's backward, where the weights are read
        model(x).sum().backward()
        opt.step()
    started = now()
    queue_heavy_work()
    queued = now() - started
    tracer.close()
    print(json.dumps({"timed": timed, "queued": queued}))


def check_budget_timing() -> list[str]:
    folder = Path(tempfile.mkdtemp(prefix="cascade-gpu-"))
    done = subprocess.run([sys.executable, __file__, "budgeted", str(folder / "trace.jsonl"), *sys.argv[1:]],
                          check=True, capture_output=True, text=True)  # fmt: skip
    facts = json.loads(done.stdout.strip().splitlines()[-1])
    later = facts["timed"][1:]  # the first plans the checksums' buffers
    print(f"budget: sampled steps' fingerprints timed at {max(later or [0]) * 1e3:.2f} ms at most; "
          f"the work queued before them {facts['queued'] * 1e3:.1f} ms")
    if len(later) < 2 or max(later) >= facts["queued"] / 4:
        return ["the budget was told the fingerprints took as long as the work queued before them"]
    return []


def now() -> float:
    if DEVICE == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter()


def check_checksums() -> list[str]:
    failures = []
    generator = torch.Generator().manual_seed(1)
    host = [torch.randn(1000, 300, generator=generator), torch.randn(7, generator=generator),
            torch.randn(5, generator=generator).to(torch.bfloat16), torch.randn(3, dtype=torch.float64),
            torch.randn(device_checksum.SLICE + 5, generator=generator)]  # fmt: skip
    on_device = [t.to(DEVICE) for t in host]
    torch.use_deterministic_algorithms(True)
    try:
        kept = DeviceChecksums(torch)
        first = kept(on_device)
        if first != DeviceChecksums(torch)(host):
            failures.append("device checksums differ from the same sums over the CPU copy")
        on_device[1][3] = torch.nextafter(on_device[1][3], torch.tensor(10.0, device=DEVICE))
        changed = kept(on_device)
        if [i for i, (a, b) in enumerate(zip(first, changed, strict=True)) if a != b] != [1]:
            failures.append("one ulp in tensor 1 did not change its checksum alone")
    except RuntimeError as exc:
        failures.append(f"device checksums under use_deterministic_algorithms(True): {exc}")
    finally:
        torch.use_deterministic_algorithms(False)
    return failures


def check_trace_reproduces() -> list[str]:
    folder = Path(tempfile.mkdtemp(prefix="cascade-gpu-"))
    traces = []
    for name, seed in (("a", 0), ("b", 0), ("c", 1)):
        path = folder / f"{name}.jsonl"
        subprocess.run([sys.executable, __file__, "train", str(path), str(seed), *sys.argv[1:]], check=True)
        traces.append(path.read_text().splitlines())
    a, b, c = traces
    failures = []
    if len(a) < 30 or a != b:
        first = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)
        failures.append(f"two seeded runs wrote different traces ({len(a)} vs {len(b)} lines; "
                        f"the first difference at line {first})")  # fmt: skip
    if a[:1] == c[:1]:
        failures.append("another seed wrote the same first step")
    steps = [json.loads(line) for line in a if '"step"' in line]
    read_at_once = json.loads((folder / "a.after.json").read_text())
    if [[step["params_after"]["5.bias"], step["batch"]] for step in steps] != read_at_once:
        failures.append("the trace's fingerprints of the weights and batches (read at its flush) are not "
                        "those read at each step")  # fmt: skip
    print(f"trace: {len(steps)} steps, weights fingerprint {next(iter(steps[1]['params_after'].values()))}")
    return failures


def check_sparse_batch() -> list[str]:
    """A batch on the device holding a sparse tensor (a graph's adjacency) is fingerprinted, its
    dense tensors left on the device; it stopped the trace before."""
    from cascade_repro.determinism import fingerprint

    adjacency = torch.zeros(5, 5)
    adjacency[0, 3] = adjacency[3, 0] = 1.0
    batch = {"adj": adjacency.to_sparse().to(DEVICE), "x": torch.randn(5, 8).to(DEVICE)}
    try:
        taken = step_values.batch_fingerprint(torch, batch, {})
        if isinstance(taken, fingerprint.Later):
            taken = step_values.joined(fingerprint.settle(torch, [taken])[0])
        general = step_values.joined(fingerprint.fingerprints(torch, step_values.tensors_in(torch, batch)))
    except RuntimeError as exc:
        return [f"a sparse tensor in a batch on the device: {exc!r}"]
    return [] if taken == general else ["a sparse batch's fingerprint differs from the general path's"]


def main() -> int:
    if DEVICE == "cuda" and not torch.cuda.is_available():
        print("no GPU here (pass --cpu to try this script on CPU tensors)")
        return 1
    torch.ones(1, device=DEVICE)  # the stack is read where the script has started CUDA
    stack = torch_stack(torch)
    print(json.dumps({k: v for k, v in stack.items() if v not in (None, "")}, indent=1, default=str))
    failures = check_checksums() + check_sparse_batch() + check_trace_reproduces() + check_budget_timing()
    for failure in failures:
        print(f"FAILED: {failure}")
    print("all checks passed" if not failures else f"{len(failures)} checks failed")
    return 1 if failures else 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["train"]:
        train(sys.argv[2], int(sys.argv[3]))
    elif sys.argv[1:2] == ["budgeted"]:
        budgeted(sys.argv[2])
    else:
        sys.exit(main())
