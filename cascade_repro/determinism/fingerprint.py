"""Fingerprints of tensors over their bit patterns: equal iff every bit (and dtype, shape) is equal.

Never a float sum: ±0.0, NaN payloads and one-ulp changes all change the fingerprint. This module
runs inside the training process, so it imports only the standard library, torch (passed in by the
caller, never imported here) and, when installed, xxhash.

- CPU tensors: xxh3-64 over the tensor's memory (read in place through its data pointer), seeded
  with its dtype and shape. Without xxhash: blake2b-64 (slower; recorded as the algorithm).
- Tensors on an accelerator: an order-sensitive integer checksum computed on the device; all
  tensors of one step come back in a single small copy (determinism/device_checksum.py).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
from typing import Any, NamedTuple, Sequence

from cascade_repro.determinism.device_checksum import DeviceChecksums, PendingChecksums, read_pending
from cascade_repro.determinism.device_checksum import header as _header

xxhash: Any
try:
    import xxhash

    ALGORITHM = "xxh3_64"
except ImportError:  # the child may run where only torch is installed
    xxhash = None
    ALGORITHM = "blake2b_64"

DEVICE_ALGORITHM = "poswsum_2x64"  # determinism/device_checksum.py


@functools.lru_cache(maxsize=256)
def _bytes_type(size: int) -> Any:
    return ctypes.c_ubyte * size  # building an array type costs more than hashing a small tensor


def _raw(tensor: Any) -> Any:
    """A zero-copy view of a CPU tensor's bytes."""
    size = tensor.nbytes
    if size == 0:
        return b""
    return _bytes_type(size).from_address(tensor.data_ptr())


def _header_state(header: bytes) -> Any:
    return xxhash.xxh3_64(header) if xxhash is not None else hashlib.blake2b(header, digest_size=8)


class Later(NamedTuple):
    """Fingerprints some of which are still on a device (`InPlaceHashes.later`): `values` holds the
    CPU tensors' and "" where `pending` (positions, checksums) fills in; `settle` reads them."""

    values: list[str]
    pending: list[tuple[list[int], PendingChecksums]]


def settle(torch: Any, later: Sequence[Later]) -> list[list[str]]:
    """The fingerprints of many `later` calls, their device checksums copied back at once."""
    pending = [entry for one in later for _, entry in one.pending]
    read = iter(read_pending(torch, pending))
    out = []
    for one in later:
        values = list(one.values)
        for indices, _ in one.pending:
            for index, value in zip(indices, next(read), strict=True):
                values[index] = value
        out.append(values)
    return out


class InPlaceHashes:
    """Fingerprints of the same list of tensors taken again and again (the step trace's parameters,
    gradients), in one call: for each position the header's hash state and a view of the tensor's
    bytes are kept while the tensor there keeps its address and layout, so a step costs one layout
    check and one pass over the bytes per tensor. A kept view reads that tensor's memory as it is
    now; another layout over the same memory (a square transpose) or a non-contiguous tensor is
    never read through a kept view. Tensors on an accelerator get their checksums on the device, one
    copy back per device (a `DeviceChecksums` kept per device), now or, with `later`, at `settle`."""

    in_place_device = "cpu"  # the device type hashed in place (a test routes CPU tensors elsewhere)

    def __init__(self, torch: Any) -> None:
        self.torch = torch
        self._kept: list[tuple[tuple[Any, ...], Any, Any] | None] = []
        self._devices: dict[Any, DeviceChecksums] = {}  # their plans and buffers, kept

    def __call__(self, tensors: Sequence[Any]) -> list[str]:
        """Every tensor's fingerprint (a device's checksums copied back now: waiting for it)."""
        taken = self._take(tensors, defer=False)
        assert isinstance(taken, list)
        return taken

    def wait(self) -> None:
        """Wait until the accelerators it has read tensors on have done all they were given (before
        timing a call: the wait is for the work queued before it, not the call's cost)."""
        for device in self._devices:
            backend = getattr(self.torch, device.type, None)
            synchronize = getattr(backend, "synchronize", None)
            if synchronize is None:
                continue
            try:
                synchronize(device)
            except TypeError:  # one that takes no device (mps)
                synchronize()

    def later(self, tensors: Sequence[Any]) -> list[str] | Later:
        """The same fingerprints, those of tensors on a device left there to be read with others
        (`settle`): taking them does not wait for the device."""
        return self._take(tensors, defer=True)

    def _take(self, tensors: Sequence[Any], defer: bool) -> list[str] | Later:
        kept = self._kept
        if len(kept) != len(tensors):
            kept[:] = [None] * len(tensors)
        out: list[str] = []
        elsewhere: dict[Any, list[int]] = {}
        in_place = self.in_place_device
        for index, tensor in enumerate(tensors):
            if tensor.device.type != in_place:
                elsewhere.setdefault(tensor.device, []).append(index)
                out.append("")
                continue
            try:
                layout = (tensor.data_ptr(), tensor.dtype, tensor.shape, tensor.stride())
            except RuntimeError:  # no strided memory (a sparse embedding's gradient): nothing to keep
                out.append(cpu_hash(tensor))
                continue
            entry = kept[index]
            if entry is None or entry[0] != layout:
                if not tensor.is_contiguous():  # a temporary copy: nothing to keep
                    out.append(cpu_hash(tensor))
                    continue
                entry = kept[index] = (layout, _header_state(_header(tensor)), _raw(tensor.detach()))
            state = entry[1].copy()
            state.update(entry[2])
            out.append(state.hexdigest())
        if not elsewhere:  # all in place (the CPU case, every step): no more to do
            return out
        pending = self._on_devices(tensors, elsewhere, out, defer)
        return Later(out, pending) if pending else out

    def _on_devices(self, tensors: Sequence[Any], elsewhere: dict[Any, list[int]], out: list[str],
                    defer: bool) -> list[tuple[list[int], PendingChecksums]]:  # fmt: skip
        """The checksums of the tensors on each device: into `out` now, or pending (`defer`)."""
        pending = []
        for device, indices in elsewhere.items():
            on_device = self._devices.get(device)
            if on_device is None:
                on_device = self._devices[device] = DeviceChecksums(self.torch)
            on_it = [tensors[i] for i in indices]
            try:
                if defer:
                    pending.append((indices, on_device.start(on_it)))
                    continue
                values = on_device(on_it)
            except RuntimeError:  # no strided memory (a sparse embedding's gradient)? read now
                with_sparse = self._with_sparse(on_device, on_it)
                if with_sparse is None:
                    raise
                values = with_sparse
            for index, value in zip(indices, values, strict=True):
                out[index] = value
        return pending

    def _with_sparse(self, on_device: DeviceChecksums, tensors: list[Any]) -> list[str] | None:
        """Checksums of tensors on a device some of which are sparse (None if none is): the others
        in one call (their plan kept), each sparse one from the tensors it is stored in."""
        sparse = {i for i, t in enumerate(tensors) if is_sparse(t)}
        if not sparse:
            return None
        dense = [i for i in range(len(tensors)) if i not in sparse]
        values = [""] * len(tensors)
        for index, value in zip(dense, on_device([tensors[i] for i in dense]) if dense else [], strict=True):
            values[index] = value
        for index in sparse:
            values[index] = self._sparse_checksum(tensors[index])
        return values

    def _sparse_checksum(self, tensor: Any) -> str:
        return sparse_device_checksum(self.torch, tensor)


# (dtype, shape): the header's hash state (copied, never updated) and the ctypes type of the bytes
# (None: no bytes). A batch keeps its shape step to step; each is built once, not per call.
_LAYOUTS: dict[tuple[Any, Any], tuple[Any, Any]] = {}
_LAYOUTS_KEPT = 256


def _layout_of(tensor: Any) -> tuple[Any, Any]:
    key = (tensor.dtype, tensor.shape)
    layout = _LAYOUTS.get(key)
    if layout is None:
        if len(_LAYOUTS) >= _LAYOUTS_KEPT:  # shapes that keep changing (sequences of any length)
            _LAYOUTS.clear()
        size = tensor.nbytes
        layout = _LAYOUTS[key] = (_header_state(_header(tensor)), _bytes_type(size) if size else None)
    return layout


def cpu_hash(tensor: Any) -> str:
    """16 hex digits over dtype, shape and the bytes of a CPU tensor (a sparse one: of the tensors
    that hold it, as they are stored)."""
    t = tensor  # read in place: no detach() (a new tensor object, 1-2 µs between training steps)
    try:
        if not t.is_contiguous():
            t = t.detach().contiguous()
        header, raw = _layout_of(t)
        state = header.copy()
        if raw is not None:
            state.update(raw.from_address(t.data_ptr()))
    except RuntimeError:  # no strided memory to read
        parts = sparse_parts(t.detach())
        if parts is None:
            raise
        return _of_parts(t, [cpu_hash(part) for part in parts])
    return str(state.hexdigest())


_SPARSE_PARTS = {
    "torch.sparse_coo": ("_indices", "_values"),  # as stored, coalesced or not
    "torch.sparse_csr": ("crow_indices", "col_indices", "values"),
    "torch.sparse_bsr": ("crow_indices", "col_indices", "values"),
    "torch.sparse_csc": ("ccol_indices", "row_indices", "values"),
    "torch.sparse_bsc": ("ccol_indices", "row_indices", "values"),
}


def _of_parts(tensor: Any, hashes: list[str]) -> str:
    """A sparse tensor's fingerprint from those of the tensors it is stored in."""
    state = _header_state(f"{tensor.layout}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
    for value in hashes:
        state.update(value.encode())
    return str(state.hexdigest())


def is_sparse(tensor: Any) -> bool:
    return str(tensor.layout) in _SPARSE_PARTS


def sparse_device_checksum(torch: Any, tensor: Any) -> str:
    """A sparse tensor on a device: the checksums of the tensors it is stored in, with its layout,
    dtype and shape (read now)."""
    return _of_parts(tensor, DeviceChecksums(torch)(sparse_parts(tensor.detach()) or []))


def sparse_parts(tensor: Any) -> list[Any] | None:
    """The strided tensors a sparse tensor is stored in (None for another layout)."""
    names = _SPARSE_PARTS.get(str(tensor.layout))
    return None if names is None else [getattr(tensor, name)() for name in names]


def device_checksums(torch: Any, tensors: Sequence[Any]) -> list[str]:
    """Order-sensitive checksums of tensors on one device, copied back to the host once
    (determinism/device_checksum.py; a caller that takes them again and again keeps a
    `DeviceChecksums`). Works on CPU tensors too (that is how it is tested without a GPU)."""
    return DeviceChecksums(torch)(tensors)


def fingerprints(torch: Any, tensors: Sequence[Any]) -> list[str]:
    """Fingerprint each tensor where it lives: CPU tensors hashed in place, the rest on device.
    (A caller that hashes the same tensors again and again keeps an `InPlaceHashes`.)"""
    out: list[str | None] = [None] * len(tensors)
    by_device: dict[Any, list[int]] = {}
    in_place = InPlaceHashes.in_place_device
    for index, tensor in enumerate(tensors):
        if tensor.device.type == in_place:
            out[index] = cpu_hash(tensor)
        else:
            by_device.setdefault(tensor.device, []).append(index)
    for indices in by_device.values():
        dense = []
        for index in indices:
            if is_sparse(tensors[index]):
                out[index] = sparse_device_checksum(torch, tensors[index])
            else:
                dense.append(index)
        for index, value in zip(dense, device_checksums(torch, [tensors[i] for i in dense]), strict=True):
            out[index] = value
    return [v or "" for v in out]
