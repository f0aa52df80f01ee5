"""The fingerprint of the tensors a checkpoint holds, taken from the object the script saves.

The step trace fingerprints the weights an optimizer updates. What it does not see (an EMA copy
updated by hand, layers frozen part-way, buffers such as BatchNorm's running statistics) often ends
in a checkpoint: `cascade verify` compares the tensors two runs saved under one path at one step,
so such state that differs is not called bitwise identical. Only tensors count: a timestamp or a
run time saved beside them (HF's trainer state) is no difference. Read where the script calls
`torch.save`, from memory (the file is not read back); a failure leaves the checkpoint without one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cascade_repro.child.step_values import combine
from cascade_repro.determinism import fingerprint

MAX_TENSORS = 100_000  # a checkpoint with more is not fingerprinted (its record says nothing)
MAX_DEPTH = 32


def tensors_fingerprint(torch: Any, obj: Any) -> str | None:
    """blake2b-64 over each tensor's key path and fingerprint, in a fixed order (mappings by key);
    None where `obj` holds no tensor or too many."""
    try:
        named = _tensors(torch, obj)
        if not named or len(named) > MAX_TENSORS:
            return None
        hashes = fingerprint.fingerprints(torch, [tensor for _, tensor in named])
    except Exception:  # (never the script's problem: its save goes on)
        return None
    return combine([f"{name}={value}".encode() for (name, _), value in zip(named, hashes, strict=True)])


def _tensors(torch: Any, obj: Any) -> list[tuple[str, Any]]:
    found: list[tuple[str, Any]] = []
    stack: list[tuple[str, Any, int]] = [("", obj, 0)]
    while stack and len(found) <= MAX_TENSORS:
        name, item, depth = stack.pop()
        if isinstance(item, torch.Tensor):
            found.append((name, item))
        elif depth >= MAX_DEPTH:
            continue
        elif isinstance(item, torch.nn.Module):
            stack.append((name, item.state_dict(), depth + 1))
        elif isinstance(item, Mapping):
            keys = sorted(item, key=str)
            stack.extend((f"{name}.{key}", item[key], depth + 1) for key in reversed(keys))
        elif isinstance(item, (list, tuple)):
            items = list(enumerate(item))
            stack.extend((f"{name}[{index}]", value, depth + 1) for index, value in reversed(items))
    return found
