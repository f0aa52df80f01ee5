"""How far apart two runs' tensors are at the step where their fingerprints first differ.

Fingerprints say *that* a tensor differs, not by how much. `cascade verify --replay` re-runs both
runs up to that step and saves the tensors there (`StepTracer.dump_at`); this module compares the
two saved sets: per tensor, how many elements differ in their bits and the largest |a - b|.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from cascade_repro.determinism.compare import FacetDifference

TENSOR_FACETS = ("params_before", "grads", "params_after")
_INT_VIEW = {1: "uint8", 2: "int16", 4: "int32", 8: "int64"}


@dataclass(frozen=True)
class Magnitude:
    facet: str
    name: str
    differing: int  # elements whose bits differ
    elements: int
    max_abs: float | None  # largest |a - b| over them; inf where one side is NaN; None: not numeric

    @property
    def detail(self) -> str:
        noun = "element" if self.elements == 1 else "elements"
        size = f"{self.differing} of {self.elements} {noun}"
        if self.max_abs is None:
            return f"{size} differ"
        return f"max |Δ| {self.max_abs:.3g}, {size}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "facet": self.facet,
            "name": self.name,
            "differing": self.differing,
            "elements": self.elements,
            "max_abs": None if self.max_abs is None or math.isinf(self.max_abs) else self.max_abs,
            "max_abs_is_infinite": self.max_abs is not None and math.isinf(self.max_abs),
            "detail": self.detail,
        }


def magnitudes(
    torch: Any,
    dump_a: Mapping[str, Mapping[str, Any]],
    dump_b: Mapping[str, Mapping[str, Any]],
    differences: Sequence[FacetDifference],
) -> tuple[list[Magnitude], list[str]]:
    """Magnitudes for the tensors the fingerprints named, and what could not be measured (why)."""
    found: list[Magnitude] = []
    missing: list[str] = []
    for difference in differences:
        if difference.facet not in TENSOR_FACETS:
            continue
        for name in difference.names:
            a = (dump_a.get(difference.facet) or {}).get(name)
            b = (dump_b.get(difference.facet) or {}).get(name)
            if a is None or b is None:
                missing.append(f"{difference.facet} {name}: not saved by both replays")
            elif a.dtype != b.dtype or a.shape != b.shape:
                missing.append(
                    f"{difference.facet} {name}: {a.dtype}{list(a.shape)} vs {b.dtype}{list(b.shape)}"
                )
            else:
                found.append(_compare(torch, difference.facet, name, a, b))
    return found, missing


def _compare(torch: Any, facet: str, name: str, a: Any, b: Any) -> Magnitude:
    flat_a, flat_b = a.reshape(-1), b.reshape(-1)
    view = getattr(torch, _INT_VIEW[flat_a.element_size()])
    differ = flat_a.view(view) != flat_b.view(view)  # bits, so -0.0 vs 0.0 and NaN payloads count
    differing = int(differ.sum())
    if flat_a.dtype == torch.bool:
        return Magnitude(facet, name, differing, flat_a.numel(), None)
    if differing == 0:
        return Magnitude(facet, name, 0, flat_a.numel(), 0.0)
    left = flat_a[differ].to(torch.complex128 if flat_a.is_complex() else torch.float64)
    right = flat_b[differ].to(left.dtype)
    delta = (left - right).abs()
    delta[left.isnan() | right.isnan()] = math.inf  # NaN against anything else: infinitely far
    delta[(left == right) & ~(left.isnan() | right.isnan())] = 0.0  # ±0.0: bits differ, values equal
    return Magnitude(facet, name, differing, flat_a.numel(), float(delta.max()))
