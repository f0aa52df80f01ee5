"""The on-device checksum (determinism/device_checksum.py), run on CPU tensors: every tensor's two
sums as the documented formula gives them, computed here in Python integers, however the tensors
are packed and sliced; one plan kept per layout, and nothing allocated by a repeated call."""

from __future__ import annotations

import hashlib

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from cascade_repro.determinism import device_checksum
from cascade_repro.determinism.device_checksum import DeviceChecksums

MASK = (1 << 64) - 1
M = 0x9E3779B97F4A7C15
WIDTH_VIEW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def reference(tensor: torch.Tensor) -> str:
    """S1 = Σ x_i·(i·M + 1), S2 = Σ (x_i xor i)·(2i + 1) over the bits as integers, mod 2**64,
    plus and minus the dtype-and-shape code."""
    flat = tensor.detach().contiguous().reshape(-1)
    xs = flat.view(WIDTH_VIEW.get(flat.element_size(), torch.uint8)).tolist()
    xs = [int(x) for x in xs]  # bool views read as 0/1, the rest as signed integers (uint8 as unsigned)
    s1 = sum(x * (i * M + 1) for i, x in enumerate(xs))
    s2 = sum((x ^ i) * (2 * i + 1) for i, x in enumerate(xs))
    header = f"{tensor.dtype}|{tuple(tensor.shape)}|".encode()
    meta = int.from_bytes(hashlib.blake2b(header, digest_size=7).digest(), "little")
    return f"{(s1 + meta) & MASK:016x}{(s2 - meta) & MASK:016x}"


def mixed_tensors() -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(3)
    return [
        torch.randn(40, 9, generator=generator),
        torch.randn(7, generator=generator),
        torch.randn(9, 6, generator=generator).t(),  # not contiguous
        torch.randn(5, generator=generator).to(torch.float16),
        torch.randn(6, generator=generator).to(torch.bfloat16),
        torch.tensor([True, False, True]),
        torch.arange(-4, 11),
        torch.tensor([255, 0, 7], dtype=torch.uint8),
        torch.randn(4, dtype=torch.float64, generator=generator),
        torch.randn(3, dtype=torch.complex128, generator=generator),  # 16-byte elements: read as bytes
        torch.zeros(0),
        torch.tensor(-0.0),
        torch.randn(300, generator=generator),
    ]


@pytest.mark.parametrize(
    "slice_, small, packed",
    [
        (device_checksum.SLICE, device_checksum.SMALL, device_checksum.PACKED),  # as shipped: all packed
        (7, 5, 12),  # some packed until the pack is full, the rest in slices of 7 (a 360-element tensor: 52)
        (50, 0, 0),  # nothing packed
    ],
)
def test_every_tensors_checksum_is_the_documented_sums(
    monkeypatch: pytest.MonkeyPatch, slice_: int, small: int, packed: int
) -> None:
    monkeypatch.setattr(device_checksum, "SLICE", slice_)
    monkeypatch.setattr(device_checksum, "SMALL", small)
    monkeypatch.setattr(device_checksum, "PACKED", packed)
    tensors = mixed_tensors()
    assert DeviceChecksums(torch)(tensors) == [reference(t) for t in tensors]


@pytest.fixture
def small_slices(monkeypatch: pytest.MonkeyPatch) -> None:
    """Slices of 16 elements, tensors of up to 8 packed, 12 elements packed in all."""
    monkeypatch.setattr(device_checksum, "SLICE", 16)
    monkeypatch.setattr(device_checksum, "SMALL", 8)
    monkeypatch.setattr(device_checksum, "PACKED", 12)


@pytest.mark.usefixtures("small_slices")
def test_a_changed_bit_changes_that_tensors_checksum_only_and_the_plan_is_kept() -> None:
    # packed, packed, in three slices, in one
    tensors = [torch.randn(6), torch.randn(5), torch.randn(40), torch.randn(3)]
    checksums = DeviceChecksums(torch)
    before = checksums(tensors)
    plan = checksums._plan
    for index, position in ((1, 4), (2, 37)):  # a packed tensor's last element, a third slice's
        original = tensors[index][position].item()
        tensors[index][position] = torch.nextafter(tensors[index][position], torch.tensor(10.0))
        changed = checksums(tensors)
        assert [i for i in range(4) if changed[i] != before[i]] == [index]
        assert changed[index] == reference(tensors[index])
        tensors[index][position] = original
        assert checksums(tensors) == before
    assert checksums._plan is plan  # the same layout: planned once
    checksums([*tensors, torch.randn(2)])
    assert checksums._plan is not plan


def allocations(call) -> list[int]:  # type: ignore[no-untyped-def]
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as profiled:
        call()
    made = ("aten::empty", "aten::empty_strided", "[memory]")
    return [e.cpu_memory_usage for e in profiled.events() if e.name in made and e.cpu_memory_usage > 0]


def test_a_repeated_call_allocates_nothing_the_size_of_a_tensor() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(300, 400), torch.nn.ReLU(), torch.nn.Linear(400, 10))
    params = [*model.parameters(), torch.randn(3 * device_checksum.SLICE // 2)]  # one tensor in two slices
    checksums = DeviceChecksums(torch)
    first = checksums(params)
    again: list[str] = []
    repeated = allocations(lambda: again.extend(checksums(params)))
    assert again == first
    # a parallel reduction's scratch (a few bytes a thread) is all; the first call's buffers are not
    assert max(repeated, default=0) <= 64
    assert max(allocations(lambda: DeviceChecksums(torch)(params))) > 1 << 20


@pytest.mark.usefixtures("small_slices")
def test_checksums_left_on_the_device_read_later_are_those_of_their_call() -> None:
    tensors = [torch.randn(6), torch.randn(40), torch.randn(3)]  # packed, in three slices, packed
    other_layout = [torch.randn(5, 2), torch.arange(9)]
    checksums, other = DeviceChecksums(torch), DeviceChecksums(torch)
    expected = [[reference(t) for t in tensors]]
    pending = [checksums.start(tensors)]
    for step in range(2):  # the weights change; the next call reuses the plan's buffers
        tensors[1][37 - step] += 1.0
        expected.append([reference(t) for t in tensors])
        pending.append(checksums.start(tensors))
    expected.append([reference(t) for t in other_layout])
    pending.append(other.start(other_layout))
    tensors[0].zero_()  # after the last call: read later, the checksums are still those of their call
    assert device_checksum.read_pending(torch, pending) == expected
    assert len({tuple(values) for values in expected[:3]}) == 3
