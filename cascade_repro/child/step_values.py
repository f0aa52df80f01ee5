"""What a training step's trace record reads from torch: loss bits, RNG states, batch and
parameter names; kept apart from the tracer, which decides when to read them."""

from __future__ import annotations

import array
import ctypes
import gc
import hashlib
import random
import struct
import sys
import warnings
from collections.abc import Mapping
from typing import Any, NamedTuple

from cascade_repro.determinism import fingerprint
from cascade_repro.determinism.device_checksum import DeviceChecksums

_LOSS_INT = {2: "int16", 4: "int32", 8: "int64"}


class LossBits(NamedTuple):
    """A float32/float64 loss on CPU, read as it was when its step ended."""

    bits: int
    width: int  # bytes


def loss_now(torch: Any, loss: Any) -> Any:
    """The loss as it is now, for `loss_record` later (a script may reuse its memory, a buffer of
    losses): a CPU float32/float64 scalar's bits are read at once (no allocation), any other loss
    is copied (on an accelerator: no synchronisation now)."""
    if type(loss) is torch.Tensor and loss.is_cpu:  # (a subclass may hold no memory)
        dtype = loss.dtype
        if dtype is torch.float32:
            return LossBits(ctypes.c_int32.from_address(loss.data_ptr()).value, 4)
        if dtype is torch.float64:
            return LossBits(ctypes.c_int64.from_address(loss.data_ptr()).value, 8)
    return loss.detach().clone()


class LossParts(NamedTuple):
    """The losses one step backpropagated, more than one (gradient accumulation), each as `loss_now`
    gave it: recorded as their sum, each one's bits kept (`loss_record`)."""

    parts: list[Any]


def losses_now(torch: Any, losses: list[Any]) -> Any:
    """A step's losses as they are now: the one (`loss_now`), or all of them (`LossParts`)."""
    if len(losses) == 1:
        return loss_now(torch, losses[0])
    return LossParts([loss_now(torch, loss) for loss in losses])


def read_losses(torch: Any, records: list[dict[str, Any]]) -> None:
    """The records' float32/float64 losses still held as tensors (on an accelerator: copies not read
    yet) as bits, copied back at once per device and dtype: one wait for the device per flush of the
    trace rather than one per step. `loss_record` gives the same record as it would for each alone."""
    groups: dict[tuple[Any, Any], list[dict[str, Any]]] = {}
    for record in records:
        loss: Any = record.get("loss")
        # (a tensor subclass, a DTensor, is read alone: stacking may mean something else for it)
        if type(loss) is torch.Tensor and loss.dtype in (torch.float32, torch.float64) and loss.numel() == 1:
            groups.setdefault((loss.device, loss.dtype), []).append(record)
    for (_, dtype), members in groups.items():
        width = 4 if dtype == torch.float32 else 8
        stacked = torch.stack([record["loss"].reshape(()) for record in members])
        bits = stacked.view(torch.int32 if width == 4 else torch.int64).tolist()
        for record, value in zip(members, bits, strict=True):
            record["loss"] = LossBits(value, width)


def loss_record(torch: Any, loss: Any) -> dict[str, Any] | None:
    """The loss as exact bits, its value and dtype (from `loss_now`: bits already read, or a tensor)."""
    if loss is None:
        return None
    if isinstance(loss, LossBits):
        return _from_bits(loss.bits, loss.width)
    if isinstance(loss, LossParts):  # the sum in their order (as the gradients were), each one's bits
        parts = [loss_record(torch, part) for part in loss.parts]
        dtypes = {part["dtype"] for part in parts if part}
        return {"bits": [part["bits"] if part else None for part in parts],
                "value": sum(part["value"] for part in parts if part),
                "dtype": dtypes.pop() if len(dtypes) == 1 else "mixed", "parts": len(parts)}  # fmt: skip
    flat = loss.reshape(1)
    dtype = str(loss.dtype).replace("torch.", "")
    if flat.dtype in (torch.float32, torch.float64):  # one read: value from the bits
        width = 4 if flat.dtype == torch.float32 else 8
        if flat.device.type == "cpu":  # straight from memory, no dispatch
            bits = (ctypes.c_int32 if width == 4 else ctypes.c_int64).from_address(flat.data_ptr()).value
        else:
            bits = int(flat.view(torch.int32 if width == 4 else torch.int64).item())
        return _from_bits(bits, width)
    view = _LOSS_INT.get(flat.element_size())
    other = int(flat.view(getattr(torch, view)).item()) if view and flat.is_floating_point() else None
    return {"bits": other, "value": float(flat.item()), "dtype": dtype}


def _from_bits(bits: int, width: int) -> dict[str, Any]:
    unsigned = bits & ((1 << (8 * width)) - 1)
    value = struct.unpack("<f" if width == 4 else "<d", unsigned.to_bytes(width, "little"))[0]
    return {"bits": bits, "value": value, "dtype": "float32" if width == 4 else "float64"}


class RngStates:
    """Reads the generators' states at each step's start (the tracer keeps one): copies of torch's
    (hashed later, `rng_hash`); with `others`, fingerprints of Python's and numpy's too.

    Read between training steps, where each Python operation costs microseconds: numpy's global
    generator straight from its memory (its documented `ctypes.state_address`;
    `numpy.random.get_state` builds a dict and copies the key, ~60 µs there), checked once against
    `get_state`, which it gives way to if they disagree. (Cloning torch's generator,
    `Generator.clone_state`, costs as much as its `get_state` there: 7-10 µs.)"""

    def __init__(self, torch: Any) -> None:
        self.torch = torch
        self._torch_state = torch.default_generator.get_state
        self._cuda_initialized = torch.cuda.is_initialized
        self._numpy: tuple[Any, Any, int] | None = None  # (numpy, its bit generator, state address)
        self._numpy_checked = False

    def __call__(self, others: bool) -> dict[str, Any]:
        states: dict[str, Any] = {"torch": self._torch_state()}
        if self._cuda_initialized():
            states["cuda"] = self.torch.cuda.get_rng_state_all()
        if not others:
            return states
        version, internal, gauss_next = random.getstate()
        states["python"] = combine([array.array("Q", internal).tobytes(), repr(gauss_next).encode()])
        numpy = sys.modules.get("numpy")
        if numpy is not None and hasattr(numpy, "random"):
            states["numpy"] = self._numpy_state(numpy)
        return states

    def _numpy_state(self, numpy: Any) -> str:
        """The fingerprint of numpy's global MT19937 state: its key and position."""
        kept = self._numpy
        if kept is not None and kept[0] is numpy and _numpy_bit_generator(numpy) is kept[1]:
            address = kept[2]
            pos = ctypes.c_int.from_address(address + _MT_KEY_BYTES).value
            return combine([(ctypes.c_char * _MT_KEY_BYTES).from_address(address), str(pos).encode()])
        value = numpy_state(numpy)
        if not self._numpy_checked:  # once: the memory read agrees with get_state, or is not used
            self._numpy_checked = True
            self._numpy = _numpy_memory(numpy)
            if self._numpy is not None and self._numpy_state(numpy) != value:
                self._numpy = None
        return value


_MT_KEY_BYTES = 624 * 4  # numpy's mt19937_state: uint32 key[624], then int pos


def numpy_state(numpy: Any) -> str:
    """The fingerprint of numpy's global generator, from `numpy.random.get_state`."""
    state = numpy.random.get_state(legacy=False)["state"]
    return combine([state["key"].tobytes(), str(state["pos"]).encode()])


def _numpy_bit_generator(numpy: Any) -> Any:
    return getattr(getattr(getattr(numpy.random, "mtrand", None), "_rand", None), "_bit_generator", None)


def _numpy_memory(numpy: Any) -> tuple[Any, Any, int] | None:
    """(numpy, the global generator's MT19937, the address of its state), None where it is another."""
    generator = _numpy_bit_generator(numpy)
    if type(generator).__name__ != "MT19937":
        return None
    try:
        address = int(generator.ctypes.state_address)
    except (AttributeError, TypeError, ValueError):
        return None
    return (numpy, generator, address) if address else None


def rng_hash(state: Any) -> str:
    """A generator state as read at the step's start: already a fingerprint, a state tensor, or one
    state tensor per CUDA device."""
    if isinstance(state, str):
        return state
    if isinstance(state, list):
        return combine([fingerprint.cpu_hash(s).encode() for s in state])
    return fingerprint.cpu_hash(state)


def batch_fingerprint(torch: Any, batch: Any, kept: dict[Any, DeviceChecksums] | None = None
                      ) -> str | fingerprint.Later | None:  # fmt: skip
    """Position-sensitive fingerprint of the tensors in a batch (nested lists, tuples, dicts).

    Taken as each batch is yielded, between training steps, where every Python operation costs
    microseconds (the step has flushed the caches): the usual batch, a flat list or tuple of CPU
    tensors (inputs, targets), is hashed directly, the same fingerprint at half the cost. Given
    `kept` (the tracer's checksums per device: a batch keeps its layout step to step), tensors on an
    accelerator are summed there and read when the trace is written (a `fingerprint.Later`, settled by
    step_tensors.settle), not waited for at every step."""
    if type(batch) in (list, tuple) and 0 < len(batch) <= 16:
        hashes = []
        for t in batch:
            if type(t) is not torch.Tensor or not t.is_cpu:
                break
            hashes.append(fingerprint.cpu_hash(t))
        else:
            return joined(hashes)
    tensors = tensors_in(torch, batch)
    if not tensors:
        return None
    in_place = fingerprint.InPlaceHashes.in_place_device
    elsewhere: dict[Any, list[int]] = {}
    for index, tensor in enumerate(tensors):
        if tensor.device.type != in_place:
            elsewhere.setdefault(tensor.device, []).append(index)
    if kept is None or not elsewhere:
        return joined(fingerprint.fingerprints(torch, tensors))
    values = [fingerprint.cpu_hash(t) if t.device.type == in_place else "" for t in tensors]
    pending = []
    for device, indices in elsewhere.items():
        checksums = kept.get(device) or kept.setdefault(device, DeviceChecksums(torch))
        pending += _started_on(torch, checksums, tensors, indices, values)
    return fingerprint.Later(values, pending)


def _started_on(torch: Any, checksums: DeviceChecksums, tensors: list[Any], indices: list[int],
                values: list[str]) -> list[tuple[list[int], Any]]:  # fmt: skip
    """The checksums of a batch's tensors on one device, started there (read at the flush); a
    sparse one (a graph's adjacency: no strided memory) read now, into `values`."""
    try:
        return [(indices, checksums.start([tensors[i] for i in indices]))]
    except RuntimeError:
        dense = [i for i in indices if not fingerprint.is_sparse(tensors[i])]
        if len(dense) == len(indices):
            raise
        for i in set(indices) - set(dense):
            values[i] = fingerprint.sparse_device_checksum(torch, tensors[i])
        return [(dense, checksums.start([tensors[i] for i in dense]))] if dense else []


def both_batches(first: str | fingerprint.Later | None,
                 then: str | fingerprint.Later) -> str | fingerprint.Later:  # fmt: skip
    """One step's batches, `first` (those so far) then `then`: `joined`, or once read from a device."""
    if first is None:
        return then
    if isinstance(first, str) and isinstance(then, str):
        return joined([first, then])
    head = first if isinstance(first, fingerprint.Later) else fingerprint.Later([first], [])
    tail = then if isinstance(then, fingerprint.Later) else fingerprint.Later([then], [])
    offset = len(head.values)
    shifted = [([index + offset for index in indices], entry) for indices, entry in tail.pending]
    return fingerprint.Later(head.values + tail.values, head.pending + shifted)


def joined(hashes: list[str]) -> str:
    """A batch's fingerprint from its tensors', in order: `combine` of them, in one call where each
    is 16 hex digits (always, but for a hand-made list) rather than two per part."""
    if len(hashes) == 1:
        return hashes[0]
    if set(map(len, hashes)) != {16}:
        return combine([h.encode() for h in hashes])
    digest = _COMBINE_16.copy()
    digest.update(_LENGTH_16.join(hashes).encode())
    return digest.hexdigest()


_LENGTH_16 = (16).to_bytes(8, "little").decode()  # the length `combine` puts before a 16-digit part
_COMBINE_16 = hashlib.blake2b(_LENGTH_16.encode(), digest_size=8)  # (only ever copied: a constant)


def combine(parts: list[Any]) -> str:
    """blake2b-64 over each part (bytes, or a buffer) preceded by its length."""
    digest = hashlib.blake2b(digest_size=8)
    for part in parts:
        digest.update(len(part).to_bytes(8, "little"))
        digest.update(part)
    return digest.hexdigest()


def tensors_in(torch: Any, batch: Any, limit: int = 16) -> list[Any]:
    found: list[Any] = []
    stack = [batch]
    while stack and len(found) < limit:
        item = stack.pop(0)
        if isinstance(item, torch.Tensor):
            found.append(item)
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
        elif isinstance(item, Mapping):  # a dict, or HF's BatchEncoding / BatchFeature (a UserDict)
            stack.extend(item[k] for k in sorted(item, key=str))
    return found


def named_parameters(torch: Any, modules: list[Any] | None = None) -> list[tuple[str, Any]]:
    """(module path, parameter) for every parameter of the root modules, sorted by path: of every
    live module (a scan of the objects the garbage collector tracks), or of `modules`."""
    if modules is None:
        with warnings.catch_warnings():  # isinstance() on some lazy torch objects warns
            warnings.simplefilter("ignore")
            modules = [o for o in gc.get_objects() if isinstance(o, torch.nn.Module)]
    found, _ = roots_parameters(modules)
    return found


COMPILED = "_orig_mod"  # where torch.compile's OptimizedModule holds the module it compiled


def roots_parameters(modules: list[Any]) -> tuple[list[tuple[str, Any]], bool]:
    """The parameters of those of `modules` that are no other's child, named from their root and
    sorted by name; and whether a parameter is under two roots (named from the first of them).

    A module compiled with `torch.compile` names them as the module itself does (its `_orig_mod`
    left out of the path), so a compiled run's trace compares with an uncompiled one's."""
    children = {id(c) for m in modules for c in m.children()}
    seen: set[int] = set()
    found: list[tuple[str, Any]] = []
    shared = False
    for root in modules:
        if id(root) in children:
            continue
        for name, param in root.named_parameters():
            if id(param) in seen:
                shared = True
            else:
                seen.add(id(param))
                if COMPILED in name:
                    name = ".".join(part for part in name.split(".") if part != COMPILED)
                found.append((name, param))
    return sorted(found, key=lambda item: item[0]), shared
