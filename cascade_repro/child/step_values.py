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
    if type(loss) is torch.Tensor and loss.device.type == "cpu":  # (a subclass may hold no memory)
        dtype = loss.dtype
        if dtype is torch.float32:
            return LossBits(ctypes.c_int32.from_address(loss.data_ptr()).value, 4)
        if dtype is torch.float64:
            return LossBits(ctypes.c_int64.from_address(loss.data_ptr()).value, 8)
    return loss.detach().clone()


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


def rng_states(torch: Any, others: bool) -> dict[str, Any]:
    """Copies of torch's generator states (hashed later, `rng_hash`); with `others`, fingerprints
    of Python's and numpy's too."""
    states: dict[str, Any] = {"torch": torch.get_rng_state()}
    if torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.get_rng_state_all()
    if not others:
        return states
    version, internal, gauss_next = random.getstate()
    states["python"] = combine([array.array("Q", internal).tobytes(), repr(gauss_next).encode()])
    numpy = sys.modules.get("numpy")
    if numpy is not None and hasattr(numpy, "random"):
        state = numpy.random.get_state(legacy=False)["state"]
        states["numpy"] = combine([state["key"].tobytes(), str(state["pos"]).encode()])
    return states


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
    if type(batch) in (list, tuple) and 0 < len(batch) <= 16 and all(
            type(t) is torch.Tensor and t.is_cpu for t in batch):  # fmt: skip
        return joined([fingerprint.cpu_hash(t) for t in batch])
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
        pending.append((indices, checksums.start([tensors[i] for i in indices])))
    return fingerprint.Later(values, pending)


def joined(hashes: list[str]) -> str:
    """A batch's fingerprint from its tensors', in order."""
    return hashes[0] if len(hashes) == 1 else combine([h.encode() for h in hashes])


def combine(parts: list[bytes]) -> str:
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


def named_parameters(torch: Any) -> list[tuple[str, Any]]:
    """(module path, parameter) for every parameter of the live root modules, sorted by path."""
    with warnings.catch_warnings():  # isinstance() on some lazy torch objects warns
        warnings.simplefilter("ignore")
        modules = [o for o in gc.get_objects() if isinstance(o, torch.nn.Module)]
    children = {id(c) for m in modules for c in m.children()}
    seen: set[int] = set()
    found: list[tuple[str, Any]] = []
    for root in modules:
        if id(root) in children:
            continue
        for name, param in root.named_parameters():
            if id(param) not in seen:
                seen.add(id(param))
                found.append((name, param))
    return sorted(found, key=lambda item: item[0])
