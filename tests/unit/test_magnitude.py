"""Magnitudes of a divergence from two saved sets of tensors: bits counted, |Δ| measured."""

from __future__ import annotations

import torch

from cascade_repro.determinism.compare import FacetDifference
from cascade_repro.determinism.magnitude import magnitudes


def _one(a: torch.Tensor, b: torch.Tensor, facet: str = "params_after") -> dict:
    found, missing = magnitudes(
        torch, {facet: {"w": a}}, {facet: {"w": b}}, [FacetDifference(facet, ("w",), "")]
    )
    assert missing == []
    (magnitude,) = found
    return magnitude.to_dict()


def test_one_ulp_in_one_element() -> None:
    a = torch.linspace(-1, 1, 12).reshape(3, 4)
    b = a.clone()
    b[2, 1] = torch.nextafter(b[2, 1], torch.tensor(2.0))
    m = _one(a, b)
    assert (m["differing"], m["elements"]) == (1, 12)
    assert m["max_abs"] == float(b[2, 1].double() - a[2, 1].double()) > 0
    assert m["detail"] == f"max |Δ| {m['max_abs']:.3g}, 1 of 12 elements"


def test_signed_zeros_differ_in_bits_not_in_value() -> None:
    m = _one(torch.tensor([0.0, 1.0]), torch.tensor([-0.0, 1.0]))
    assert m["differing"] == 1 and m["max_abs"] == 0.0


def test_nan_against_a_number_is_infinitely_far() -> None:
    m = _one(torch.tensor([1.0, 2.0]), torch.tensor([float("nan"), 2.0]))
    assert m["differing"] == 1 and m["max_abs"] is None and m["max_abs_is_infinite"] is True
    assert "inf" in m["detail"]


def test_bf16_and_integers_are_measured_and_equal_tensors_are_zero() -> None:
    a = torch.tensor([1.0, 2.0, 3.0], dtype=torch.bfloat16)
    m = _one(a, a * torch.tensor([1.0, 1.0, 2.0], dtype=torch.bfloat16))
    assert (m["differing"], m["max_abs"]) == (1, 3.0)
    m = _one(torch.tensor([5, 7]), torch.tensor([5, -7]), facet="grads")
    assert (m["facet"], m["differing"], m["max_abs"]) == ("grads", 1, 14.0)
    assert _one(a, a.clone())["max_abs"] == 0.0


def test_what_cannot_be_compared_is_said() -> None:
    difference = [FacetDifference("grads", ("w", "v"), ""), FacetDifference("loss", (), "")]
    found, missing = magnitudes(
        torch,
        {"grads": {"w": torch.zeros(2), "v": torch.zeros(2)}},
        {"grads": {"w": torch.zeros(3)}},
        difference,
    )
    assert found == []
    assert missing == ["grads w: torch.float32[2] vs torch.float32[3]", "grads v: not saved by both replays"]
