"""Traces recorded under an earlier rule, compared with today's as that rule allows.

`cascade.trace/1` (written until December 2026) kept one micro-batch a step: a gradient-accumulation
step's record held its last batch's fingerprint and its last backpropagated loss. `cascade.trace/2` holds
every batch the step trained on (fingerprinted together, `"batches": N` where N > 1) and the sum of
its losses, each one's bits kept (`"parts": N`). Steps of one batch and one loss read the same in
both. Where the two runs were recorded under different rules, a step of several batches or losses is
compared on what both kept: its last loss, and not its batch. A record without a format is /1.

`cascade.trace/3` records, under mixed precision's GradScaler, the loss the script handed to
`scaler.scale` and a step the scaler skipped as a step of its own (`"skipped": true`); before it, the
scaled loss (times a scale that changes over the run) and a skipped step merged into the next, every
later step numbered one lower. A run of a GradScaler (its header: `grad_scaler`) does not compare
with one recorded before /3: the verdict says so (`scaler_incomparable`) rather than a divergence.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from typing import Any

ONE_MICRO_BATCH = "cascade.trace/1"

Records = Sequence[dict[str, Any]]


def recorded_one_micro_batch(header: Mapping[str, Any]) -> bool:
    return header.get("format", ONE_MICRO_BATCH) == ONE_MICRO_BATCH


SCALED_LOSS = (ONE_MICRO_BATCH, "cascade.trace/2")  # a GradScaler's scaled loss, its skipped steps merged


def scaler_incomparable(header_a: Mapping[str, Any], header_b: Mapping[str, Any], id_a: str,
                        id_b: str) -> str | None:  # fmt: skip
    """Why a GradScaler run recorded now cannot be compared with one recorded before /3 (None: it can)."""
    for older, newer, run_id in ((header_a, header_b, id_a), (header_b, header_a, id_b)):
        before = older.get("format", ONE_MICRO_BATCH) in SCALED_LOSS
        if before and newer.get("grad_scaler") and newer.get("format") not in SCALED_LOSS:
            return (f"run {run_id[:12]} was recorded by a cascade that traced a GradScaler's scaled loss and "
                    "merged a step it skipped into the next, the other one's loss as the script computed "
                    "it: their traces do not compare; record both with this cascade")  # fmt: skip
    return None


def as_one_micro_batch(older: Records, newer: Records) -> tuple[Records, Records, bool]:
    """`older` (one micro-batch a step) and `newer` (every one) as the older rule kept them: the newer
    trace's losses of several parts are their last part, and the batches of the steps the newer trace
    trained on several are compared in neither. The traces as given where no step had several
    (whether any had: the third value)."""
    several = {i for i, line in enumerate(_lines(newer)) if '"parts":' in line or '"batches":' in line}
    if not several:
        return older, newer, False
    newer_kept: list[dict[str, Any]] = []
    steps: set[Any] = set()
    for index, record in enumerate(newer):
        if index in several and (record.get("loss") is not None and "parts" in record["loss"]
                                 or record.get("batches") is not None):  # fmt: skip
            record = dict(record)
            if record.get("loss") is not None and "parts" in record["loss"]:
                record["loss"] = last_part(record["loss"])
            if record.pop("batches", None) is not None:
                record["batch"] = None
                steps.add(record.get("step"))
        newer_kept.append(record)
    older_kept = [{**r, "batch": None} if r.get("step") in steps else r for r in older]
    return older_kept, newer_kept, True


def last_part(loss: dict[str, Any]) -> dict[str, Any] | None:
    """A step's loss of several parts as its last one alone: its bits, and the value they hold."""
    bits, dtype = loss["bits"][-1], loss.get("dtype")
    if bits is None:
        return None
    return {"bits": bits, "value": _value(bits, dtype), "dtype": dtype}


_FORMATS = {"float32": ("<i", "<f"), "float64": ("<q", "<d"), "float16": ("<h", "<e")}


def _value(bits: int, dtype: Any) -> float:
    """The number `bits` hold as `dtype` (NaN where they cannot be read: an unknown dtype)."""
    try:
        if dtype == "bfloat16":
            return float(struct.unpack("<f", struct.pack("<I", (bits & 0xFFFF) << 16))[0])
        packed, unpacked = _FORMATS[dtype]
        return float(struct.unpack(unpacked, struct.pack(packed, bits))[0])
    except (KeyError, struct.error):
        return float("nan")


def _lines(records: Records) -> list[str]:
    """Each record's text where the trace is still text (`TraceRecords`), else its keys: enough to
    find the records with several parts or batches without parsing every one."""
    lines = getattr(records, "lines", None)
    if isinstance(lines, list):
        return lines
    return [" ".join(f'"{key}":' for key in (*r, *(r.get("loss") or {}))) for r in records]
