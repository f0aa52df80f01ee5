"""The trace's fingerprints of tensors on an accelerator (determinism/device_checksum.py): kernels,
memory allocated and time per call, for all of a model's parameters at once, beside the same sums
taken one tensor at a time (the previous implementation: ~14 kernels and ~9 temporaries of 8 bytes
per element, per tensor), reading every parameter once (`sum`, the physical floor) and copying them
to the host for hashlib sha256 (what a script would do by hand).

Issue 17: "one fingerprint call over all parameters of a device rather than one per tensor, no
per-step allocation". Runs on CUDA where torch sees a GPU, else on CPU tensors (the same code; the
kernels and allocations are counted the same way, the times are a CPU's). Fails (non-zero exit) if
the two checksums disagree or a repeated call allocates anything the size of a tensor.
"""

from __future__ import annotations

import hashlib
import statistics
import sys
import time
from typing import Any, Callable

import torch
from torch.profiler import ProfilerActivity, profile

from cascade_repro.determinism.device_checksum import MULTIPLIER, DeviceChecksums, int_bits, meta_code

METADATA = {"aten::detach", "aten::reshape", "aten::view", "aten::slice", "aten::select", "aten::alias",
            "aten::as_strided", "aten::_reshape_alias", "aten::lift_fresh", "aten::empty", "aten::t",
            "aten::resize_", "aten::empty_strided"}  # fmt: skip
MADE = ("aten::empty", "aten::empty_strided", "[memory]")


def per_tensor(tensors: list[Any]) -> list[str]:
    """The same checksums one tensor at a time, as the trace took them before."""
    sums = []
    for tensor in tensors:
        bits = int_bits(torch, tensor).to(torch.int64)
        pos = torch.arange(bits.numel(), device=bits.device, dtype=torch.int64)
        meta = meta_code(tensor)
        first = (bits * (pos * MULTIPLIER + 1)).sum()
        second = ((bits ^ pos) * (2 * pos + 1)).sum()
        sums.append(torch.stack([first + meta, second - meta]))
    host = torch.stack(sums).cpu().tolist()
    return [f"{a & (2**64 - 1):016x}{b & (2**64 - 1):016x}" for a, b in host]


def sha256_on_host(tensors: list[Any]) -> None:
    for tensor in tensors:
        hashlib.sha256(tensor.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes()).digest()


def read_once(tensors: list[Any]) -> None:
    [t.sum() for t in tensors]


def model(device: str, width: int, layers: int) -> list[Any]:
    """A transformer's parameter shapes: per layer 4 projections, 2 MLP matrices, norms and biases."""
    shapes = [(32000 // 8, width)]
    for _ in range(layers):
        shapes += [(width, width)] * 4 + [(4 * width, width), (width, 4 * width)]
        shapes += [(width,)] * 4 + [(4 * width,), (width,)]
    generator = torch.Generator().manual_seed(0)
    return [torch.randn(*shape, generator=generator).to(device) for shape in shapes]


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def timed(call: Callable[[], Any], device: str, repeats: int = 7) -> float:
    call()
    sync(device)
    took = []
    for _ in range(repeats):
        started = time.perf_counter()
        call()
        sync(device)
        took.append(time.perf_counter() - started)
    return statistics.median(took)


def counted(call: Callable[[], Any], device: str) -> tuple[int, int]:
    """Kernels launched (CUDA) or compute operators run (CPU), and the largest allocation."""
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=activities, profile_memory=True) as profiled:
        call()
        sync(device)
    events = profiled.events()
    if device == "cuda":
        kernels = sum(1 for e in events if e.device_type == torch.autograd.DeviceType.CUDA)
        made = [e.device_memory_usage for e in events if e.name in MADE and e.device_memory_usage > 0]
    else:
        kernels = sum(1 for e in events if e.cpu_parent is None and e.name.startswith("aten::")
                      and e.name not in METADATA)  # fmt: skip
        made = [e.cpu_memory_usage for e in events if e.name in MADE and e.cpu_memory_usage > 0]
    return kernels, max(made, default=0)


def compare(device: str, params: list[Any]) -> bool:
    """Prints one model's figures; False if a repeated call of the kept checksums allocated memory
    the size of a tensor."""
    kept = DeviceChecksums(torch)
    if kept(params) != per_tensor(params):
        sys.exit("the kept checksums differ from the same sums taken one tensor at a time")
    floor = timed(lambda: read_once(params), device)
    unit = "kernels" if device == "cuda" else "operators"
    ok = True
    for name, call in (
        ("kept, all at once", lambda: kept(params)),
        ("one tensor at a time", lambda: per_tensor(params)),
        ("sha256 on the host", lambda: sha256_on_host(params)),
    ):
        took = timed(call, device)
        kernels, largest = counted(call, device)
        print(f"{name:22}: {took * 1e3:8.2f} ms ({took / floor:6.1f} x reading once), {kernels:5} {unit}, "
              f"largest allocation {largest / 2**20:7.2f} MiB")  # fmt: skip
        ok = ok and not (name.startswith("kept") and largest > 64)
    print(f"{'reading every tensor once':22}: {floor * 1e3:8.2f} ms")
    return ok


def main() -> None:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    ok = True
    for width, layers in ((256, 4), (1024, 4)):
        params = model(device, width, layers)
        size = sum(p.numel() * p.element_size() for p in params)
        print(f"-- {device}: {len(params)} tensors, {size / 2**20:.0f} MiB (width {width}, {layers} layers)")
        ok = compare(device, params) and ok
    if not ok:
        sys.exit("a repeated call of the kept checksums allocated memory the size of a tensor")


if __name__ == "__main__":
    main()
