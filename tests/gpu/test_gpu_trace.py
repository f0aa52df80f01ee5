"""The trace on a CUDA device: on-device checksums and a real seeded run verified twice.

Runs where torch sees a GPU (the GPU machines some tasks are lent); elsewhere it skips, saying so.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from cascade_repro.determinism.fingerprint import device_checksums, fingerprints
from tests.plugin import Project

pytestmark = pytest.mark.requires_cuda

SCRIPT = """
import torch
device = torch.device("cuda")
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Dropout(0.1), torch.nn.Linear(64, 1)).to(device)
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
x = torch.randn(128, 32, device=device)
y = x.sum(dim=1, keepdim=True)
for _ in range(10):
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()
"""


def test_device_checksums_see_every_bit_and_match_the_cpu_path() -> None:
    base = torch.linspace(-2, 2, 1000, device="cuda")
    ulp = base.clone()
    ulp[500] = torch.nextafter(ulp[500], torch.tensor(10.0, device="cuda"))
    zero = torch.zeros(4, device="cuda")
    negative_zero = zero.clone()
    negative_zero[1] = -0.0
    values = [
        *device_checksums(torch, [base, ulp, base.flip(0), zero, negative_zero]),
        *device_checksums(torch, [base.to(torch.bfloat16)]),
    ]
    assert len(set(values)) == len(values)
    # the same checksum computed on the CPU copy: where the tensor lives does not change it
    assert device_checksums(torch, [base.cpu()]) == device_checksums(torch, [base])
    # fingerprints() routes CUDA tensors to the device checksum, CPU tensors to xxh3, keeping order
    mixed = fingerprints(torch, [base, base.cpu()])
    assert mixed[0] == device_checksums(torch, [base])[0] and len(mixed[1]) == 16


def test_a_models_checksums_in_one_call_under_deterministic_mode_allocate_nothing_again() -> None:
    """`--deterministic strict` turns on torch's deterministic algorithms: the checksums' kernels
    (cumulative sums, index_select) must run under it; a repeated call reuses its buffers."""
    from cascade_repro.determinism import device_checksum
    from cascade_repro.determinism.device_checksum import DeviceChecksums

    model = torch.nn.Sequential(torch.nn.Linear(300, 400), torch.nn.LayerNorm(400), torch.nn.Linear(400, 10))
    params = [*model.to("cuda").parameters(), torch.randn(device_checksum.SLICE + 7, device="cuda")]
    torch.use_deterministic_algorithms(True)
    try:
        checksums = DeviceChecksums(torch)
        first = checksums(params)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        again = checksums(params)
        torch.cuda.synchronize()
        grew = torch.cuda.max_memory_allocated() - before
    finally:
        torch.use_deterministic_algorithms(False)
    assert again == first == DeviceChecksums(torch)([p.detach().cpu() for p in params])
    assert grew <= 1 << 16, f"a repeated call took {grew} more bytes of device memory"


def test_checksums_left_on_the_device_are_read_later_as_they_were() -> None:
    """`trace: full` leaves each step's checksums on the device and reads them at the trace's flush."""
    from cascade_repro.determinism.device_checksum import DeviceChecksums, read_pending

    weights = [torch.randn(2000, 300, device="cuda"), torch.randn(300, device="cuda")]
    checksums = DeviceChecksums(torch)
    expected, pending = [], []
    for _ in range(3):
        expected.append(DeviceChecksums(torch)([w.cpu() for w in weights]))
        pending.append(checksums.start(weights))
        weights[0].mul_(1.5)  # queued after the checksums: they must not see it
    assert read_pending(torch, pending) == expected and len({tuple(e) for e in expected}) == 3


def test_a_seeded_cuda_run_twice_is_bitwise_identical(project: Project) -> None:
    project.write("gpu_train.py", SCRIPT)
    project.commit("gpu script")
    # every step's weights read (not as the budget allows): step 1's are looked at below
    a = project.record("--deterministic", "strict", "--trace-budget", "0", "gpu_train.py")
    b = project.record("--deterministic", "strict", "gpu_train.py")
    manifest = project.manifest(a)
    assert manifest["trace"]["steps"] == 10 and manifest["trace"]["grads"] is True  # cheap on a device
    assert manifest["determinism"]["flags_at_start"]["cudnn.deterministic"] is True
    result = project.cascade("verify", a, b, "--json")
    verdict = json.loads(result.stdout)["data"]
    assert result.returncode == 0 and verdict["verdict"] == "BITWISE_IDENTICAL", verdict["summary"]
    trace = project.client().download_artifacts(a, "cascade/trace.jsonl", str(project.root / ".dl"))
    records = [json.loads(line) for line in Path(trace).read_text().splitlines()]
    # CUDA's generator is fingerprinted once CUDA is up (after step 0 began); weights by checksum
    assert "cuda" in records[1]["rng"] and len(records[1]["params_after"]["0.weight"]) == 32



def test_the_budget_times_the_fingerprints_not_the_work_queued_before_them(tmp_path: Path) -> None:
    """A sampled step's checksums are copied back, which waits for the device: the work the step
    queued before them is waited for first, untimed, so the budget sees the checksums' own cost
    (benchmarks/scripts/gpu_trace_check.py, which gpu_check.sh runs where only torch is installed)."""
    import subprocess
    import sys

    script = Path(__file__).parents[2] / "benchmarks" / "scripts" / "gpu_trace_check.py"
    done = subprocess.run([sys.executable, str(script), "budgeted", str(tmp_path / "trace.jsonl")],
                          check=True, capture_output=True, text=True, timeout=300)  # fmt: skip
    facts = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(facts["timed"]) >= 3
    assert max(facts["timed"][1:]) < facts["queued"] / 4, facts  # the first plans the buffers
