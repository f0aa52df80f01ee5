"""Fingerprints of tensors on an accelerator: an order-sensitive checksum computed on the device for
all of a step's tensors at once and copied back to the host once (`poswsum_2x64`).

For a tensor whose bits, read as integers, are x_i (i: the position in the tensor), two sums that
wrap around in int64: S1 = Σ x_i·(i·M + 1) and S2 = Σ (x_i xor i)·(2i + 1), M the golden-ratio
constant. The fingerprint is S1 + c and S2 − c, c a code of the dtype and shape. A permutation, a
flipped sign bit or a NaN payload changes it.

The step trace fingerprints the same parameters step after step, so the work is planned once per
layout (the tensors' dtypes and shapes) and its buffers are kept on the device, bounded whatever the
model's size:
- small tensors (biases, norms: most of a model's tensors, little of its memory) are packed into one
  buffer, and each sum is one cumulative sum read at the tensors' ends: eight kernels for all of them
  (two more per integer width among them);
- the others in slices of at most SLICE elements, each copied to int64: eight kernels a slice (nine
  past a tensor's first), their sums put together on the host.
Every sum lands in one int64 buffer, copied back once. Nothing is allocated on the device per call
(a non-contiguous tensor apart, copied to be read). Works on CPU tensors too: that is how it is
tested without an accelerator, and how a checksum is compared across devices.

Copying the sums back waits for the device to finish all it was given, the step's own work too. A
caller that takes checksums every step (`trace: full`) takes them with `start` instead: the sums
are copied aside on the device (a few bytes per tensor) and read later, many calls' at once
(`read_pending`), so the host keeps running ahead of the device.
"""

from __future__ import annotations

import hashlib
from typing import Any, NamedTuple, Sequence

MULTIPLIER = 0x9E3779B97F4A7C15 - 2**64  # the golden-ratio constant as a signed int64
MASK = (1 << 64) - 1
SLICE = 1 << 21  # elements summed per kernel in a large tensor (its three or four buffers: 16 MB each)
SMALL = 1 << 16  # a tensor of at most this many elements is packed with the others ...
PACKED = 1 << 19  # ... up to this many elements packed in all
_INT_VIEW = {1: "uint8", 2: "int16", 4: "int32", 8: "int64"}


def header(tensor: Any) -> bytes:
    return f"{tensor.dtype}|{tuple(tensor.shape)}|".encode()


def meta_code(tensor: Any) -> int:
    """The dtype and shape as a number below 2**56, added to S1 and taken from S2."""
    return int.from_bytes(hashlib.blake2b(header(tensor), digest_size=7).digest(), "little")


def int_bits(torch: Any, tensor: Any) -> Any:
    """The tensor's bits as a flat integer tensor (a view; a copy only where it is not contiguous).
    Elements of another width (complex128) are read as their bytes."""
    flat = tensor.detach().reshape(-1)
    view = _INT_VIEW.get(flat.element_size(), "uint8")
    return flat.view(getattr(torch, view))


class _Slice(NamedTuple):
    tensor: int  # its position in the call
    start: int  # the slice's first element in the tensor
    length: int
    slot: int  # its four results, g the positions: Σ x·(g − start), Σ x, Σ y, Σ y·g with y = x xor g


class _Layout(NamedTuple):
    """Where each tensor's sums are in a plan's results, and its dtype and shape codes."""

    packed: list[int]  # the packed tensors' positions, in the order of their sums
    slices: list[_Slice]
    metas: list[int]


class _Plan:
    """What one layout's checksums need on the device, allocated once."""

    def __init__(self, torch: Any, device: Any, tensors: Sequence[Any], bits: Sequence[Any]) -> None:
        int64 = torch.int64
        self.metas = [meta_code(t) for t in tensors]
        numels = [b.numel() for b in bits]
        self.packed: list[int] = []  # in groups of one integer view each (a cat does not convert)
        total = 0
        for index, numel in enumerate(numels):
            if 0 < numel <= SMALL and total + numel <= PACKED:
                self.packed.append(index)
                total += numel
        self.packed.sort(key=lambda i: str(bits[i].dtype))
        self.groups: list[tuple[list[int], Any, Any]] = []  # (indices, same-view buffer, its part of x)
        at = 0
        self.x = torch.empty(total, dtype=int64, device=device)  # the packed bits, as int64
        for dtype in sorted({str(bits[i].dtype) for i in self.packed}):
            members = [i for i in self.packed if str(bits[i].dtype) == dtype]
            size = sum(numels[i] for i in members)
            same = torch.empty(size, dtype=bits[members[0]].dtype, device=device)
            self.groups.append((members, same, self.x[at : at + size]))
            at += size
        packed = set(self.packed)
        self.slices: list[_Slice] = []
        slot = 2 * len(self.packed)
        for index, numel in enumerate(numels):
            if index in packed:
                continue
            for first in range(0, numel, SLICE):
                self.slices.append(_Slice(index, first, min(SLICE, numel - first), slot))
                slot += 4
        self.results = torch.zeros(slot, dtype=int64, device=device)
        longest = max((part.length for part in self.slices), default=0)
        self.tmp = torch.empty(max(total, longest), dtype=int64, device=device)
        if self.packed:  # the packed tensors' positions, weights and last elements
            lengths = [numels[i] for i in self.packed]
            local = torch.cat([torch.arange(n, dtype=int64) for n in lengths]).to(device)
            self.local, self.w1, self.w2 = local, local * MULTIPLIER + 1, 2 * local + 1
            self.ends = (torch.tensor(lengths, dtype=int64).cumsum(0) - 1).to(device)
            self.cum = torch.empty(total, dtype=int64, device=device)
        if self.slices:
            self.x_slice = torch.empty(longest, dtype=int64, device=device)
            self.pos = torch.arange(longest, dtype=int64, device=device)
            self.shifted = torch.empty(longest, dtype=int64, device=device) if any(
                part.start for part in self.slices) else None  # fmt: skip
        self.layout = _Layout(self.packed, self.slices, self.metas)


class PendingChecksums(NamedTuple):
    """Checksums still on the device (`DeviceChecksums.start`), for `read_pending`."""

    layout: _Layout
    sums: Any  # a copy of the plan's results, on the device
    tensors: int  # how many


class DeviceChecksums:
    """Checksums of the tensors on one device, taken again and again (the trace's parameters): the
    plan and its buffers are kept while the layout stays the same."""

    def __init__(self, torch: Any) -> None:
        self.torch = torch
        self._key: tuple[Any, ...] | None = None
        self._plan: _Plan | None = None

    def __call__(self, tensors: Sequence[Any]) -> list[str]:
        """The tensors' checksums, copied back now (waiting for the device)."""
        if not tensors:
            return []
        plan = self._sum(tensors)
        return _finish(plan.layout, plan.results.tolist(), len(tensors))  # the one copy back

    def start(self, tensors: Sequence[Any]) -> PendingChecksums:
        """The tensors' checksums as they are now, left on the device for `read_pending` (the sums
        are copied aside: the next call reuses the plan's buffers)."""
        plan = self._sum(tensors)
        return PendingChecksums(plan.layout, plan.results.clone(), len(tensors))

    def _sum(self, tensors: Sequence[Any]) -> _Plan:
        """Queue the sums of the tensors into the plan's results (planned once per layout)."""
        torch = self.torch
        bits = [int_bits(torch, t) for t in tensors]
        key = (tensors[0].device, *((t.dtype, t.shape) for t in tensors))
        if key != self._key or self._plan is None:
            with torch.inference_mode(False):  # buffers written outside inference mode later
                self._plan = _Plan(torch, tensors[0].device, tensors, bits)
            self._key = key
        plan = self._plan
        if plan.packed:
            self._packed_sums(plan, bits)
        for part in plan.slices:
            self._slice_sums(plan, part, bits[part.tensor][part.start : part.start + part.length])
        return plan

    def _packed_sums(self, plan: _Plan, bits: list[Any]) -> None:
        """The small tensors' sums: cumulative sums over all of them, read at each one's end."""
        torch, results, n = self.torch, plan.results, len(plan.packed)
        for members, same, part in plan.groups:
            torch.cat([bits[i] for i in members], out=same)
            part.copy_(same)
        tmp = plan.tmp[: plan.x.numel()]
        torch.mul(plan.x, plan.w1, out=tmp)
        torch.cumsum(tmp, 0, out=plan.cum)
        torch.index_select(plan.cum, 0, plan.ends, out=results[:n])
        torch.bitwise_xor(plan.x, plan.local, out=tmp)
        tmp.mul_(plan.w2)
        torch.cumsum(tmp, 0, out=plan.cum)
        torch.index_select(plan.cum, 0, plan.ends, out=results[n : 2 * n])

    def _slice_sums(self, plan: _Plan, part: _Slice, bits: Any) -> None:
        """A slice of a large tensor: four sums, put together on the host (`_finish`)."""
        torch, results, slot, length = self.torch, plan.results, part.slot, part.length
        x, tmp = plan.x_slice[:length], plan.tmp[:length]
        x.copy_(bits)
        positions = plan.pos[:length]
        torch.mul(x, positions, out=tmp)
        torch.sum(tmp, 0, out=results[slot])
        torch.sum(x, 0, out=results[slot + 1])
        if part.start:  # the positions in the tensor: start + j
            assert plan.shifted is not None
            positions = torch.arange(part.start, part.start + length, out=plan.shifted[:length])
        torch.bitwise_xor(x, positions, out=tmp)
        torch.sum(tmp, 0, out=results[slot + 2])
        tmp.mul_(positions)
        torch.sum(tmp, 0, out=results[slot + 3])


def read_pending(torch: Any, pending: Sequence[PendingChecksums]) -> list[list[str]]:
    """The checksums of many `start` calls, in their order: one copy back per device."""
    out: list[list[str]] = [[] for _ in pending]
    by_device: dict[Any, list[int]] = {}
    for index, entry in enumerate(pending):
        by_device.setdefault(entry.sums.device, []).append(index)
    for indices in by_device.values():
        values = torch.cat([pending[i].sums for i in indices]).tolist()
        at = 0
        for i in indices:
            entry = pending[i]
            size = entry.sums.numel()
            out[i] = _finish(entry.layout, values[at : at + size], entry.tensors)
            at += size
    return out


def _finish(layout: _Layout, values: list[int], count: int) -> list[str]:
    """Each tensor's two sums from the copied-back results, with its dtype and shape code."""
    first, second = [0] * count, [0] * count
    n = len(layout.packed)
    for k, index in enumerate(layout.packed):  # sums from the cumulative sums at the tensors' ends
        first[index] = values[k] - (values[k - 1] if k else 0)
        second[index] = values[n + k] - (values[n + k - 1] if k else 0)
    for part in layout.slices:  # with g = start + j: S1 = M·(Σ x·j + start·Σ x) + Σ x, S2 = 2·Σ y·g + Σ y
        weighted, total, xored, xored_weighted = values[part.slot : part.slot + 4]
        first[part.tensor] += MULTIPLIER * (weighted + part.start * total) + total
        second[part.tensor] += 2 * xored_weighted + xored
    return [
        f"{(s1 + meta) & MASK:016x}{(s2 - meta) & MASK:016x}"
        for s1, s2, meta in zip(first, second, layout.metas, strict=True)
    ]
