"""Compare two step traces in causal order and find the first step where anything differs.

Pure: records in, a `TraceComparison` out. Per step the facets are compared in the order they
come into being: rng → batch → params before → loss → grads → params after.

The RNG state comes first because it shows a cause before its effect; it is not itself a result of
training. Where only RNG states differ over the whole overlap (a generator seeded from `--seed`
that the script never drew from, while it seeds the ones it uses itself), no step diverges: every
batch, loss, gradient and weight is equal, and a note names the generators.

A trace with a cost budget fingerprints the weights and gradients only at sampled steps: a facet
one side did not record at a step is not compared there. The first divergence is then exact only
where the weights were compared at the step before it; otherwise the comparison brackets it
(`bracket_start`: the first step it can be at, the step after the last one whose weights agreed),
and `cascade verify --replay` re-runs both with every facet to pin it. A budget may also thin the
records themselves (steps of a few milliseconds): the traces are then compared at the steps both
recorded (determinism/verdict.py cuts them to those), and a divergence seen after steps without
records is bracketed the same way. A facet a record does not hold at all (the weights alone, read
at exit, for a last step that had no record) is not compared there. Where one run ended inside a
step (a record that says "unfinished": a killed run's closure), only what that step began with is
compared there: its loss and weights are not the step's outcome.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence

from cascade_repro.determinism.trace_file import (
    TraceRecords,
    ended_inside,
    equal_prefix,
    next_difference,
    step_of,
)

FACETS = ("rng", "batch", "params_before", "loss", "grads", "params_after")
SAMPLED_FACETS = ("grads", "params_after")  # at the steps a trace budget allowed (or every step)
AFTER_ITS_START = ("loss", "grads", "params_after")  # not the step's where the run ended inside it
BEGUN_WITH = tuple(facet for facet in FACETS if facet not in AFTER_ITS_START)
FACET_WORDS = {
    "rng": "RNG state at the step's start",
    "batch": "the batch",
    "params_before": "parameters before the first step",
    "loss": "the loss",
    "grads": "gradients",
    "params_after": "parameters after the optimizer step",
}


@dataclass(frozen=True)
class FacetDifference:
    facet: str
    names: tuple[str, ...]  # tensors or RNG streams that differ ("" for loss and batch)
    detail: str

    def to_dict(self) -> dict[str, Any]:
        return {"facet": self.facet, "names": list(self.names), "detail": self.detail}


@dataclass(frozen=True)
class LossDifference:
    step: int
    absolute: float
    relative: float
    detail: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "absolute": self.absolute,
            "relative": self.relative,
            "detail": self.detail,
        }


@dataclass(frozen=True)
class TraceComparison:
    steps_a: int
    steps_b: int
    compared: int
    step: int | None  # the first step where anything differs, within the overlap
    differences: tuple[FacetDifference, ...] = ()
    loss_max_rel: float = 0.0  # the largest relative loss difference over the overlap
    # How much it matters: the first step (at or after `step`) whose loss differs, and by how much.
    loss_first_difference: LossDifference | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)
    # The divergence at `step` is the first one seen, and may be as early as this step: the weights
    # were last compared before it (a trace budget, or --trace-interval). None: `step` is exact.
    bracket_start: int | None = None

    @property
    def same_length(self) -> bool:
        return self.steps_a == self.steps_b

    def facets(self) -> list[str]:
        return [d.facet for d in self.differences]


def compare_traces(a: Sequence[dict[str, Any]], b: Sequence[dict[str, Any]],
                   ran: tuple[int, int] | None = None, gaps_bracket: bool = False) -> TraceComparison:
    """`ran`: how many steps each run had, where the records are not one a step (cut to the steps both
    recorded); `gaps_bracket`: a gap between two records is steps without one (a budget's thinning, not
    --trace-interval), so a divergence seen after it is bracketed."""
    overlap = min(len(a), len(b))
    first: int | None = None
    first_index = overlap
    differences: list[FacetDifference] = []
    same = equal_prefix(a, b, overlap)  # equal text: equal records, every facet and the loss alike
    # one run ended inside the last step both have (a killed run's): what it read there is not compared.
    # Only there: an honest trace differs from its re-run on "unfinished" nowhere else (a record from
    # someone else that says it of every step must not silence the comparison)
    last = overlap - 1
    apart_at_last = overlap > 0 and ended_inside(a, last) != ended_inside(b, last)
    index = same
    while index < overlap:
        index = next_difference(a, b, index, overlap)  # text alike but for facets one side sampled
        if index >= overlap:
            break
        found = _step_differences(a[index], b[index], ended_apart=apart_at_last and index == last)
        if found:
            first = int(a[index].get("step", index))
            first_index = index
            differences = found
            break
        index += 1
    losses_end = last if apart_at_last else overlap  # (the losses compared in full)
    notes: tuple[str, ...] = ()
    if differences and _only_rng_differs(a[first_index:overlap], b[first_index:overlap], apart_at_last):
        streams = ", ".join(differences[0].names)
        notes = (
            f"the RNG state of {streams} differs (first at step {first}), but no batch, loss, gradient or "
            "weight does at any compared step: the training never drew from it",
        )
        first, first_index, differences = None, overlap, []
    return TraceComparison(
        bracket_start=None if first is None else _bracket_start(a, b, first_index, first, gaps_bracket),
        steps_a=len(a) if ran is None else ran[0],
        steps_b=len(b) if ran is None else ran[1],
        compared=overlap,
        step=first,
        differences=tuple(differences),
        # before the first difference every loss is equal (it would be one)
        loss_max_rel=_loss_max_rel(a[first_index:losses_end], b[first_index:losses_end]),
        loss_first_difference=_first_loss_difference(a[first_index:losses_end], b[first_index:losses_end]),
        notes=notes,
    )


def _bracket_start(a: Sequence[dict[str, Any]], b: Sequence[dict[str, Any]], index: int,
                   step: int, gaps_bracket: bool) -> int | None:  # fmt: skip
    """The first step the divergence seen at `step` (record `index`) can be at, if earlier than it:
    the step after the last one whose weights both traces fingerprinted (a weight that changed at
    a step in between shows in a later loss, RNG state or batch, or not at all until then; with
    `gaps_bracket`, also a step without a record). A trace of every Nth step (--trace-interval) finds a
    divergence within N steps, as it says: no bracket."""
    if index == 0 or (not gaps_bracket and step_of(a[index - 1], index - 1) != step - 1):
        return None
    start = 0
    for back in range(index - 1, -1, -1):
        if a[back].get("params_after") is not None and b[back].get("params_after") is not None:
            start = step_of(a[back], back) + 1
            break
    return start if start < step else None


def _only_rng_differs(a: Sequence[dict[str, Any]], b: Sequence[dict[str, Any]], apart_at_last: bool) -> bool:
    pairs = list(zip(a, b, strict=False))
    return not any(d.facet != "rng" for i, (x, y) in enumerate(pairs)
                   for d in _step_differences(x, y, ended_apart=apart_at_last and i == len(pairs) - 1))


def _first_loss_difference(a: Sequence[dict[str, Any]], b: Sequence[dict[str, Any]]) -> LossDifference | None:
    for x, y in zip(a, b, strict=False):
        la, lb = x.get("loss"), y.get("loss")
        if la and lb and _loss_bits(la) != _loss_bits(lb):
            va, vb = float(la["value"]), float(lb["value"])
            absolute = abs(va - vb) if not (math.isnan(va) or math.isnan(vb)) else math.inf
            relative = absolute / max(abs(va), abs(vb), 1e-30) if math.isfinite(absolute) else math.inf
            return LossDifference(int(x.get("step", 0)), absolute, relative, _loss_detail(la, lb))
    return None


def _step_differences(x: dict[str, Any], y: dict[str, Any],
                      ended_apart: bool = False) -> list[FacetDifference]:  # fmt: skip
    """`ended_apart`: one of the two runs ended inside this step (the last both have), the other not."""
    if x == y:  # (equal records: nothing differs; records parsed because their text was not alike)
        return []
    out: list[FacetDifference] = []
    for facet in BEGUN_WITH if ended_apart else FACETS:  # (what the step began with, where one ended in it)
        left, right = x.get(facet), y.get(facet)
        if left == right or _not_compared(facet, x, y):  # (an equal facet is no difference whatever it is)
            continue
        if facet == "loss":
            if _loss_bits(left) != _loss_bits(right):
                out.append(FacetDifference("loss", (), _loss_detail(left, right)))
        elif (isinstance(left, dict) or isinstance(right, dict)) and not (isinstance(left or {}, dict)
                                                                         and isinstance(right or {}, dict)):
            out.append(FacetDifference(facet, (), "fingerprints differ"))  # one a mapping, one not
        elif isinstance(left, dict) or isinstance(right, dict):
            left, right = left or {}, right or {}
            names = tuple(sorted(k for k in set(left) | set(right) if left.get(k) != right.get(k)))
            if names:
                out.append(
                    FacetDifference(facet, names, f"{len(names)} of {len(set(left) | set(right))} differ")
                )
        elif left != right:
            out.append(FacetDifference(facet, (), "fingerprints differ"))
    return out


def _not_compared(facet: str, x: dict[str, Any], y: dict[str, Any]) -> bool:
    """A facet one of the two records lacks at this step, for a reason other than a difference."""
    if facet != "params_before" and (facet not in x or facet not in y):
        return True  # a record without it at all (the final weights' own record)
    if facet in SAMPLED_FACETS or facet == "batch":
        # not fingerprinted at this step by one of the two (a budget's sampling), or one run's batches
        # not read (recorded before cascade read mappings such as HF's BatchEncoding)
        return x.get(facet) is None or y.get(facet) is None
    return False


def _loss_bits(loss: dict[str, Any] | None) -> Any:
    return None if loss is None else (loss.get("dtype"), loss.get("bits"))


def _loss_detail(a: dict[str, Any] | None, b: dict[str, Any] | None) -> str:
    if a is None or b is None:
        return "recorded in one run only"
    va, vb = float(a["value"]), float(b["value"])
    if math.isnan(va) or math.isnan(vb):
        return f"{va!r} vs {vb!r}"
    ulps = _ulps(va, vb) if a.get("dtype") == b.get("dtype") == "float32" else None
    extra = f", {ulps} ulp" if ulps is not None and ulps < 1000 else ""
    return f"{va!r} vs {vb!r} (|Δ| {abs(va - vb):.3g}{extra})"


def _ulps(x: float, y: float) -> int | None:
    try:
        ix = struct.unpack("<i", struct.pack("<f", x))[0]
        iy = struct.unpack("<i", struct.pack("<f", y))[0]
    except OverflowError:  # not a float32 value (a record altered by hand): no ulp count
        return None
    return abs(ix - iy)


def _loss_pairs(a: Sequence[dict[str, Any]], b: Sequence[dict[str, Any]]) -> Iterator[tuple[float, float]]:
    """(loss in a, loss in b) for each step both recorded a loss."""
    if isinstance(a, TraceRecords) and isinstance(b, TraceRecords):  # from the text, records unparsed
        pairs: Iterator[tuple[Any, Any]] = ((a.loss_of(i), b.loss_of(i)) for i in range(min(len(a), len(b))))
    else:
        pairs = ((x.get("loss"), y.get("loss")) for x, y in zip(a, b, strict=False))
    for la, lb in pairs:
        if la and lb:
            yield float(la["value"]), float(lb["value"])


def _loss_max_rel(a: Sequence[dict[str, Any]], b: Sequence[dict[str, Any]]) -> float:
    worst = 0.0
    for va, vb in _loss_pairs(a, b):
        if math.isnan(va) or math.isnan(vb):
            if math.isnan(va) != math.isnan(vb):
                return math.inf
            continue
        worst = max(worst, abs(va - vb) / max(abs(va), abs(vb), 1e-30))
    return worst


def losses_within(a: Sequence[dict[str, Any]], b: Sequence[dict[str, Any]], rtol: float, atol: float) -> bool:
    """Every step's loss agrees within atol + rtol·|loss| (the numpy.isclose rule, symmetric)."""
    for va, vb in _loss_pairs(a, b):
        if math.isnan(va) and math.isnan(vb):
            continue
        if not abs(va - vb) <= atol + rtol * max(abs(va), abs(vb)):
            return False
    return True
